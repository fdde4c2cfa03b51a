/* Runs the mHC kernels (fairseq_plugins/kernels/mhc_cpu.c and the files it includes) under AddressSanitizer and
 * UndefinedBehaviorSanitizer (tests/test_kernel_sanitizers.py builds it): every entry point over a sweep of
 * well-formed shapes (exact-size heap buffers, so any read or write past them is reported; 1 and 2 threads),
 * then malformed calls that must return their error codes without touching memory. Prints "ok <calls>". */
#include "mhc_cpu.c"

#include <stdio.h>

static float *filled(int64_t count, float scale) { /* exact-size heap buffer of values in [-scale, scale) */
    float *p = malloc(sizeof(float) * (size_t)count);
    for (int64_t k = 0; k < count; k++) p[k] = scale * ((float)((k * 7919 + 13) % 2000) / 1000.0f - 1.0f);
    return p;
}

static int calls = 0;

static int run(int (*fn)(const int64_t *, void *const *, const int64_t *, int64_t), const int64_t *dims,
               float **bufs, const int64_t *sizes, int64_t count) {
    calls++;
    return fn(dims, (void *const *)bufs, sizes, count);
}

static int run2(int (*fn)(const int64_t *, float, void *const *, const int64_t *, int64_t), const int64_t *dims,
                float **bufs, const int64_t *sizes, int64_t count) { /* mhc_ and hc_coefficients: eps 1e-20 */
    calls++;
    return fn(dims, 1e-20f, (void *const *)bufs, sizes, count);
}

#define EXPECT(cond)                                                       \
    do {                                                                   \
        if (!(cond)) {                                                     \
            printf("failed: %s (line %d)\n", #cond, __LINE__);             \
            return 1;                                                      \
        }                                                                  \
    } while (0)

int main(void) {
    for (int64_t threads = 1; threads <= 2; threads++)
        for (int64_t n = 1; n <= MAX_N; n++)
            for (int64_t T = 1; T <= 19; T += 3)
                for (int64_t iters = 1; iters <= 3; iters++) {
                    int64_t K = 2 * n + n * n, C = 1 + (T * 5 + n) % 19, dims[] = {n, T, iters, threads};
                    float *logits = filled(K * T, 4.0f), *out = filled(K * T, 1.0f), *grad = filled(K * T, 1.0f);
                    float *grad_logits = filled(K * T, 1.0f);
                    int64_t kt = K * T, s2[] = {kt, kt}, s3[] = {kt, kt, kt};
                    EXPECT(run(mhc_forward, dims, (float *[]){logits, out}, s2, 2) == MHC_OK);
                    EXPECT(run(mhc_backward, dims, (float *[]){logits, grad, grad_logits}, s3, 3) == MHC_OK);
                    logits[K * T - 1] = 40.0f; /* the log domain: refused before anything is written */
                    EXPECT(run(mhc_forward, dims, (float *[]){logits, out}, s2, 2) == MHC_LOG_DOMAIN);
                    int64_t mdims[] = {n, T, C, threads}, tnc = T * n * C, tc = T * C;
                    float *x = filled(tnc, 1.0f), *u = filled(tc, 1.0f), *mixed = filled(tnc, 1.0f);
                    float *gu = filled(tc, 1.0f), *gm = filled(tnc, 1.0f), *gx = filled(tnc, 1.0f);
                    int64_t sf[] = {tnc, kt, tc, tnc}, sb[] = {tnc, kt, tc, tnc, tnc, kt};
                    EXPECT(run(mhc_mix_forward, mdims, (float *[]){x, out, u, mixed}, sf, 4) == MHC_OK);
                    EXPECT(run(mhc_mix_backward, mdims, (float *[]){x, out, gu, gm, gx, grad_logits}, sb, 6) == MHC_OK);
                    int64_t nt = n * T, spf[] = {tnc, nt, tc, tnc}, spb[] = {tnc, nt, tc, nt, tc};
                    float *post = filled(nt, 1.0f), *gpost = filled(nt, 1.0f);
                    EXPECT(run(mhc_post_forward, mdims, (float *[]){mixed, post, u, gx}, spf, 4) == MHC_OK);
                    EXPECT(run(mhc_post_backward, mdims, (float *[]){gm, post, u, gpost, gu}, spb, 5) == MHC_OK);
                    spb[3] -= 1;
                    EXPECT(run(mhc_post_backward, mdims, (float *[]){gm, post, u, gpost, gu}, spb, 5) ==
                           MHC_BAD_BUFFER + 3);
                    free(post), free(gpost);
                    int64_t hk = n * (n + 2), hdims[] = {n, T, C, threads};
                    int64_t sh[] = {tnc, C, C, (n + 2) * C, hk, hk, hk * T, hk * T};
                    float *hg = filled(C, 1.0f), *hb = filled(C, 1.0f), *hw = filled((n + 2) * C, 0.5f);
                    float *hs = filled(hk, 1.0f), *hc = filled(hk, 1.0f), *ho = filled(hk * T, 1.0f);
                    float *hz = filled(hk * T, 1.0f), *hgr = filled(hk * T, 1.0f), *hgx = filled(tnc, 1.0f);
                    float *hgg = filled(C, 1.0f), *hgb = filled(C, 1.0f), *hgw = filled((n + 2) * C, 1.0f);
                    float *hgs = filled(hk, 1.0f), *hgc = filled(hk, 1.0f);
                    EXPECT(run2(hc_coefficients, hdims, (float *[]){x, hg, hb, hw, hs, hc, ho, hz}, sh, 8) == MHC_OK);
                    int64_t shb[] = {tnc, C, C, (n + 2) * C, hk, hk * T, hk * T, tnc, C, C, (n + 2) * C, hk, hk};
                    EXPECT(run2(hc_coefficients_backward, hdims,
                                (float *[]){x, hg, hb, hw, hc, hz, hgr, hgx, hgg, hgb, hgw, hgs, hgc}, shb, 13) == MHC_OK);
                    shb[12] -= 1;
                    EXPECT(run2(hc_coefficients_backward, hdims,
                                (float *[]){x, hg, hb, hw, hc, hz, hgr, hgx, hgg, hgb, hgw, hgs, hgc}, shb, 13) ==
                           MHC_BAD_BUFFER + 12);
                    sh[6] -= 1;
                    EXPECT(run2(hc_coefficients, hdims, (float *[]){x, hg, hb, hw, hs, hc, ho, hz}, sh, 8) ==
                           MHC_BAD_BUFFER + 6);
                    free(hg), free(hb), free(hw), free(hs), free(hc), free(ho), free(hz), free(hgr), free(hgx);
                    free(hgg), free(hgb), free(hgw), free(hgs), free(hgc);
                    int64_t cdims[] = {n, T, C, iters, threads};
                    float *bias = filled(K, 1.0f), *gates = filled(3, 1.0f), *raw = filled(kt, 0.5f);
                    int64_t sc[] = {tnc, kt, K, 3, kt};
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 5) == MHC_OK);
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 4) ==
                           MHC_BAD_BUFFER + 5);
                    sc[1] -= 1;
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 5) ==
                           MHC_BAD_BUFFER + 1);
                    if (n <= MAX_LITE_N) { /* mHC-lite: 2n + n! logits in, mHC's K out */
                        int64_t kl = 2 * n + factorial(n), sl[] = {tnc, kl * T, kl, 3, kt};
                        float *lraw = filled(kl * T, 0.5f), *lbias = filled(kl, 1.0f);
                        EXPECT(run2(mhc_lite_coefficients, cdims, (float *[]){x, lraw, lbias, gates, out}, sl, 5) ==
                               MHC_OK);
                        sl[2] -= 1;
                        EXPECT(run2(mhc_lite_coefficients, cdims, (float *[]){x, lraw, lbias, gates, out}, sl, 5) ==
                               MHC_BAD_BUFFER + 2);
                        free(lraw), free(lbias);
                    }
                    free(raw), free(bias), free(gates);
                    free(logits), free(out), free(grad), free(grad_logits), free(x), free(u), free(mixed);
                    free(gu), free(gm), free(gx);
                }
    /* malformed: each must come back as its error code (the buffers are one float long: touching them would be
     * reported) */
    float *one = filled(1, 1.0f);
    float *b2[] = {one, one}, *b4[] = {one, one, one, one};
    float *b13[] = {one, one, one, one, one, one, one, one, one, one, one, one, one};
    int64_t ones[] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    const int64_t bad_dims[][4] = {{0, 1, 1, 1}, {9, 1, 1, 1}, {1, 0, 1, 1}, {1, (int64_t)1 << 40, 1, 1},
                                   {1, 1, 0, 1}, {1, 1, 1001, 1}, {1, 1, 1, 0}, {1, 1, 1, 5000},
                                   {-1, 1, 1, 1}, {1, -5, 1, 1}, {1, 1, -1, 1}, {1, 1, 1, -1}};
    for (size_t k = 0; k < sizeof bad_dims / sizeof bad_dims[0]; k++) {
        EXPECT(run(mhc_forward, bad_dims[k], b2, ones, 2) >= MHC_BAD_DIM);
        EXPECT(run(mhc_post_forward, bad_dims[k], b4, ones, 4) >= MHC_BAD_DIM);
        EXPECT(run2(hc_coefficients, bad_dims[k], b13, ones, 8) >= MHC_BAD_DIM);
        EXPECT(run2(hc_coefficients_backward, bad_dims[k], b13, ones, 13) >= MHC_BAD_DIM);
        int64_t lite_dims[] = {bad_dims[k][0], bad_dims[k][1], bad_dims[k][2], 1, bad_dims[k][3]}; /* 5 dims */
        EXPECT(run2(mhc_lite_coefficients, lite_dims, b13, ones, 5) >= MHC_BAD_DIM);
        EXPECT(run(mhc_mix_forward, bad_dims[k], b4, ones, 4) >= MHC_BAD_DIM ||
               run(mhc_mix_forward, bad_dims[k], b4, ones, 4) >= MHC_BAD_BUFFER);
    }
    int64_t dims[] = {4, 8, 20, 1}, big[] = {4, 8, 20, 1};
    EXPECT(run(mhc_forward, dims, b2, ones, 2) == MHC_BAD_BUFFER); /* sizes of one float for 24 x 8 */
    EXPECT(run(mhc_forward, dims, (float *[]){one, NULL}, ones, 2) == MHC_BAD_BUFFER);
    EXPECT(run(mhc_forward, dims, b2, ones, 3) == MHC_BAD_BUFFER + 2);
    EXPECT(run(mhc_mix_backward, big, b4, ones, 4) == MHC_BAD_BUFFER + 6);
    EXPECT(run(mhc_post_forward, big, b4, ones, 4) == MHC_BAD_BUFFER);
    EXPECT(run(mhc_post_backward, big, b4, ones, 4) == MHC_BAD_BUFFER + 5);
    EXPECT(run2(mhc_lite_coefficients, (int64_t[]){6, 1, 1, 1, 1}, b13, ones, 5) == MHC_BAD_DIM); /* n! > 120 */
    int64_t overflow[] = {8, ((int64_t)1 << 36), (int64_t)1 << 24, 1}, huge = INT64_MAX;
    EXPECT(run(mhc_mix_forward, overflow, b4, (int64_t[]){huge, huge, huge, huge}, 4) >= MHC_BAD_BUFFER);
    free(one);
    printf("ok %d\n", calls);
    return 0;
}

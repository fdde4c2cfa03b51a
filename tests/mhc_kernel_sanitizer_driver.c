/* Runs the mHC kernels (fairseq_plugins/kernels/mhc_cpu.c and mhc_mix.c) under AddressSanitizer and
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
                float **bufs, const int64_t *sizes, int64_t count) { /* mhc_coefficients: eps 1e-20 */
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
                    int64_t cdims[] = {n, T, C, iters, threads};
                    float *bias = filled(K, 1.0f), *gates = filled(3, 1.0f), *raw = filled(kt, 0.5f);
                    int64_t sc[] = {tnc, kt, K, 3, kt};
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 5) == MHC_OK);
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 4) ==
                           MHC_BAD_BUFFER + 5);
                    sc[1] -= 1;
                    EXPECT(run2(mhc_coefficients, cdims, (float *[]){x, raw, bias, gates, out}, sc, 5) ==
                           MHC_BAD_BUFFER + 1);
                    free(raw), free(bias), free(gates);
                    free(logits), free(out), free(grad), free(grad_logits), free(x), free(u), free(mixed);
                    free(gu), free(gm), free(gx);
                }
    /* malformed: each must come back as its error code (the buffers are one float long: touching them would be
     * reported) */
    float *one = filled(1, 1.0f);
    float *b2[] = {one, one}, *b4[] = {one, one, one, one};
    int64_t ones[] = {1, 1, 1, 1, 1, 1};
    const int64_t bad_dims[][4] = {{0, 1, 1, 1}, {9, 1, 1, 1}, {1, 0, 1, 1}, {1, (int64_t)1 << 40, 1, 1},
                                   {1, 1, 0, 1}, {1, 1, 1001, 1}, {1, 1, 1, 0}, {1, 1, 1, 5000},
                                   {-1, 1, 1, 1}, {1, -5, 1, 1}, {1, 1, -1, 1}, {1, 1, 1, -1}};
    for (size_t k = 0; k < sizeof bad_dims / sizeof bad_dims[0]; k++) {
        EXPECT(run(mhc_forward, bad_dims[k], b2, ones, 2) >= MHC_BAD_DIM);
        EXPECT(run(mhc_mix_forward, bad_dims[k], b4, ones, 4) >= MHC_BAD_DIM ||
               run(mhc_mix_forward, bad_dims[k], b4, ones, 4) >= MHC_BAD_BUFFER);
    }
    int64_t dims[] = {4, 8, 20, 1}, big[] = {4, 8, 20, 1};
    EXPECT(run(mhc_forward, dims, b2, ones, 2) == MHC_BAD_BUFFER); /* sizes of one float for 24 x 8 */
    EXPECT(run(mhc_forward, dims, (float *[]){one, NULL}, ones, 2) == MHC_BAD_BUFFER);
    EXPECT(run(mhc_forward, dims, b2, ones, 3) == MHC_BAD_BUFFER + 2);
    EXPECT(run(mhc_mix_backward, big, b4, ones, 4) == MHC_BAD_BUFFER + 6);
    int64_t overflow[] = {8, ((int64_t)1 << 36), (int64_t)1 << 24, 1}, huge = INT64_MAX;
    EXPECT(run(mhc_mix_forward, overflow, b4, (int64_t[]){huge, huge, huge, huge}, 4) >= MHC_BAD_BUFFER);
    free(one);
    printf("ok %d\n", calls);
    return 0;
}

/* Dynamic hyper-connections' coefficients without autograd (decoding), included by mhc_cpu.c (after mhc_mix.c,
 * whose checks and helpers it uses).
 *
 * modules/hyper_connections.py, dynamic: per token t and stream j, Hbar = LN(H_j) (the site's LayerNorm, weight
 * g, bias b, eps), then coefficient o of stream j = static[o n + j] + scale[o n + j] tanh(Hbar . w[o]) for the
 * n + 2 rows w[o] of the dynamic weight, in the fused kernels' order [W_m | W_b | W_r] (hyper_connections.py's
 * _forward_kernels): out (K, T), K = n (n + 2), row o n + j, tokens last, as mHC's mixing and depth kernels
 * read it. In PyTorch a decoding step's dozen small operators (LayerNorm of the n streams, the thin product,
 * tanh, the scales, the reordering) cost more than their arithmetic; here one pass over each stream row, which
 * stays in L1 (Hbar is never stored). LayerNorm as PyTorch's: mean, then the mean of squared deviations
 * (float32 rounding apart).
 *
 * Layout: x (T, n, C) token-major, g and b (C), w (n + 2, C), static and scale (K), out and z (K, T).
 *
 * Training (hc_coefficients_backward): the gradients of all of it in one pass per stream row (LayerNorm
 * recomputed from x, tanh kept by the forward in z), in place of autograd's LayerNorm, thin products, tanh, scales and reordering
 * backward (about 4 ms of a 1000-token unit's 7 ms).
 */

enum { HC_N, HC_TOKENS, HC_WIDTH, HC_THREADS, HC_DIMS };
enum { HC_X, HC_G, HC_B, HC_W, HC_STATIC, HC_SCALE, HC_OUT, HC_Z, HC_BUFFERS };
enum { HB_X, HB_G, HB_B, HB_W, HB_SCALE, HB_Z, HB_GRAD, HB_GRAD_X, HB_GRAD_G, HB_GRAD_B, HB_GRAD_W, HB_GRAD_STATIC,
       HB_GRAD_SCALE, HB_BUFFERS };

/* the dims, and every buffer present with its length: kinds 's' streams (T n C), 'c' C, 'w' (n + 2) C, 'k' K,
 * 'z' K T */
static int check_hc(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count, const char *kinds) {
    int64_t n = dims[HC_N], T = dims[HC_TOKENS], C = dims[HC_WIDTH];
    const int ok[HC_DIMS] = {
        [HC_N] = n >= 1 && n <= MAX_N,
        [HC_TOKENS] = T >= 1 && T <= MAX_TOKENS,
        [HC_WIDTH] = C >= 1 && C <= MAX_WIDTH,
        [HC_THREADS] = dims[HC_THREADS] >= 1 && dims[HC_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < HC_DIMS; k++)
        if (!ok[k]) return MHC_BAD_DIM + k;
    int want = (int)strlen(kinds);
    if (count != want) return MHC_BAD_BUFFER + want;
    int64_t K = n * (n + 2), tnc; /* T n C can reach 2^63 within the bounds above */
    if (__builtin_mul_overflow(T, n * C, &tnc) || tnc > INT64_MAX / 8) return MHC_BAD_BUFFER;
    for (int k = 0; k < want; k++) {
        char kind = kinds[k];
        int64_t size = kind == 's' ? tnc : kind == 'c' ? C : kind == 'w' ? (n + 2) * C : kind == 'k' ? K : K * T;
        if (!bufs[k] || sizes[k] != size) return MHC_BAD_BUFFER + k;
    }
    return MHC_OK;
}

/* mean and 1 / sqrt(var + eps) of a row, as PyTorch's LayerNorm (float32 rounding apart) */
static inline INLINE void row_moments(const float *row, int64_t C, float eps, float *mean_out, float *rstd_out) {
    vec s = {0};
    float mean = 0.0f, var = 0.0f;
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES) s += load(row + c, LANES, 0.0f);
    for (int l = 0; l < LANES; l++) mean += s[l];
    for (; c < C; c++) mean += row[c];
    mean /= (float)C;
    s = (vec){0};
    for (c = 0; c + LANES <= C; c += LANES) {
        vec d = load(row + c, LANES, 0.0f) - mean;
        s += d * d;
    }
    for (int l = 0; l < LANES; l++) var += s[l];
    for (; c < C; c++) var += (row[c] - mean) * (row[c] - mean);
    *mean_out = mean, *rstd_out = 1.0f / sqrtf(var / (float)C + eps);
}

static void hc_rows(const float *restrict x, const float *restrict g, const float *restrict b,
                    const float *restrict w, const float *restrict stat, const float *restrict scale,
                    float *out, float *zs, int64_t T, int n, int64_t C, float eps, int64_t t0,
                    int64_t t1) {
    /* out and zs not restrict: decoding passes one buffer as both (z written, then out over it) */
    for (int64_t t = t0; t < t1; t++)
        for (int j = 0; j < n; j++) {
            const float *row = x + (t * n + j) * C;
            vec acc[MAX_N + 2];
            float mean, rstd, tail[MAX_N + 2] = {0};
            int64_t c;
            row_moments(row, C, eps, &mean, &rstd);
            /* Hbar and its n + 2 products in one pass (Hbar never stored), in LANES partial sums each */
            for (int o = 0; o < n + 2; o++) acc[o] = (vec){0};
            for (c = 0; c + LANES <= C; c += LANES) {
                vec h = (load(row + c, LANES, 0.0f) - mean) * rstd * load(g + c, LANES, 0.0f);
                h += load(b + c, LANES, 0.0f);
                for (int o = 0; o < n + 2; o++) acc[o] += h * load(w + o * C + c, LANES, 0.0f);
            }
            for (; c < C; c++) {
                float h = (row[c] - mean) * rstd * g[c] + b[c];
                for (int o = 0; o < n + 2; o++) tail[o] += h * w[o * C + c];
            }
            for (int o = 0; o < n + 2; o++) {
                float z = tail[o];
                for (int l = 0; l < LANES; l++) z += acc[o][l];
                zs[(o * n + j) * T + t] = z;
            }
        }
    /* libm's tanhf, not a vectorised polynomial: one within 2 ulp moved the golden checkpoints' scores by 4 ulp
     * (tests/test_golden_models.py holds them to 1e-6); tanhf kept them, at about 10 us of a decoding call */
    for (int k = 0; k < n * (n + 2); k++)
        for (int64_t t = t0; t < t1; t++) {
            float th = tanhf(zs[k * T + t]);
            zs[k * T + t] = th; /* kept for the backward: tanh' = 1 - tanh^2, no second tanhf */
            out[k * T + t] = stat[k] + scale[k] * th;
        }
}

/* out (K, T) of the streams x (T, n, C), and z (K, T), the tanh of the products (training keeps them for the
 * backward; decoding may pass out twice). dims: n, tokens, C, threads; eps: the LayerNorm's. */
int hc_coefficients(const int64_t *dims, float eps, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_hc(dims, bufs, sizes, count, "sccwkkzz");
    if (err) return err;
    int n = (int)dims[HC_N], threads = mix_threads(dims); /* HC_* dims are MIX_*'s first four */
    int64_t T = dims[HC_TOKENS], C = dims[HC_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        hc_rows(bufs[HC_X], bufs[HC_G], bufs[HC_B], bufs[HC_W], bufs[HC_STATIC], bufs[HC_SCALE], bufs[HC_OUT],
                bufs[HC_Z], T, n, C, eps, T * id / all, T * (id + 1) / all);
    }
    return MHC_OK;
}

/* The backward of one thread's tokens: grad_x rows, and this thread's sums of the parameter gradients in
 * part = [grad_g (C) | grad_b (C) | grad_w ((n + 2) C) | grad_static (K) | grad_scale (K)]. Per stream row, from
 * gz_o = grad_o scale_o (1 - tanh^2 z_o): Hbar's gradient dh = sum_o gz_o w_o, then LayerNorm's backward
 * dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dh g; the row's dxhat kept in scratch (C). */
static void hc_backward_rows(const float *restrict x, const float *restrict g, const float *restrict b,
                             const float *restrict w, const float *restrict scale, const float *restrict zs,
                             const float *restrict grad, float *restrict grad_x, float *restrict part,
                             float *restrict scratch, int64_t T, int n, int64_t C, float eps, int64_t t0, int64_t t1) {
    int K = n * (n + 2);
    float *pg = part, *pb = part + C, *pw = part + 2 * C, *ps = pw + (n + 2) * C, *pc = ps + K;
    for (int64_t t = t0; t < t1; t++)
        for (int j = 0; j < n; j++) {
            const float *row = x + (t * n + j) * C;
            float gz[MAX_N + 2], mean, rstd, m1 = 0.0f, m2 = 0.0f;
            for (int o = 0; o < n + 2; o++) {
                int k = o * n + j;
                float th = zs[k * T + t], u = grad[k * T + t];
                ps[k] += u, pc[k] += u * th;
                gz[o] = u * scale[k] * (1.0f - th * th);
            }
            row_moments(row, C, eps, &mean, &rstd);
            vec v1 = {0}, v2 = {0};
            int64_t c = 0;
            for (; c + LANES <= C; c += LANES) { /* vectorised over C (the scalar loop was slower than autograd) */
                vec xhat = (load(row + c, LANES, 0.0f) - mean) * rstd, gc = load(g + c, LANES, 0.0f);
                vec h = xhat * gc + load(b + c, LANES, 0.0f), dh = {0};
                for (int o = 0; o < n + 2; o++) {
                    store(pw + o * C + c, load(pw + o * C + c, LANES, 0.0f) + gz[o] * h, LANES);
                    dh += gz[o] * load(w + o * C + c, LANES, 0.0f);
                }
                store(pg + c, load(pg + c, LANES, 0.0f) + dh * xhat, LANES);
                store(pb + c, load(pb + c, LANES, 0.0f) + dh, LANES);
                vec dxhat = dh * gc;
                store(scratch + c, dxhat, LANES);
                v1 += dxhat, v2 += dxhat * xhat;
            }
            for (int l = 0; l < LANES; l++) m1 += v1[l], m2 += v2[l];
            for (; c < C; c++) {
                float xhat = (row[c] - mean) * rstd, h = xhat * g[c] + b[c], dh = 0.0f;
                for (int o = 0; o < n + 2; o++) {
                    pw[o * C + c] += gz[o] * h;
                    dh += gz[o] * w[o * C + c];
                }
                pg[c] += dh * xhat, pb[c] += dh;
                float dxhat = dh * g[c];
                scratch[c] = dxhat, m1 += dxhat, m2 += dxhat * xhat;
            }
            m1 /= (float)C, m2 /= (float)C;
            float *gx = grad_x + (t * n + j) * C;
            for (c = 0; c < C; c++) gx[c] = rstd * (scratch[c] - m1 - (row[c] - mean) * rstd * m2);
        }
}

/* grad_x (T, n, C), grad_g, grad_b (C), grad_w (n + 2, C), grad_static, grad_scale (K) from grad (K, T) of out,
 * recomputing LayerNorm from x (z: the forward's tanh values). Parameter gradients summed per thread, then added in thread
 * order (deterministic for a thread count). */
int hc_coefficients_backward(const int64_t *dims, float eps, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_hc(dims, bufs, sizes, count, "sccwkzzsccwkk");
    if (err) return err;
    int n = (int)dims[HC_N], threads = mix_threads(dims), K = n * (n + 2);
    int64_t T = dims[HC_TOKENS], C = dims[HC_WIDTH], psize = (n + 4) * C + 2 * K;
    float *parts = calloc((size_t)threads * (size_t)psize + (size_t)threads * (size_t)C, sizeof(float));
    if (!parts) return MHC_NO_MEMORY;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        hc_backward_rows(bufs[HB_X], bufs[HB_G], bufs[HB_B], bufs[HB_W], bufs[HB_SCALE], bufs[HB_Z], bufs[HB_GRAD],
                         bufs[HB_GRAD_X], parts + id * psize, parts + threads * psize + id * C, T, n, C, eps,
                         T * id / all, T * (id + 1) / all);
    }
    float *outs[] = {bufs[HB_GRAD_G], bufs[HB_GRAD_B], bufs[HB_GRAD_W], bufs[HB_GRAD_STATIC], bufs[HB_GRAD_SCALE]};
    int64_t lens[] = {C, C, (n + 2) * C, K, K}, offset = 0;
    for (int k = 0; k < 5; offset += lens[k], k++)
        for (int64_t e = 0; e < lens[k]; e++) {
            float total = 0.0f;
            for (int id = 0; id < threads; id++) total += parts[id * psize + offset + e];
            outs[k][e] = total;
        }
    free(parts);
    return MHC_OK;
}

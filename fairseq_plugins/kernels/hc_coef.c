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
 * Layout: x (T, n, C) token-major, g and b (C), w (n + 2, C), static and scale (K), out (K, T).
 */

enum { HC_N, HC_TOKENS, HC_WIDTH, HC_THREADS, HC_DIMS };
enum { HC_X, HC_G, HC_B, HC_W, HC_STATIC, HC_SCALE, HC_OUT, HC_BUFFERS };

static int check_hc(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int64_t n = dims[HC_N], T = dims[HC_TOKENS], C = dims[HC_WIDTH];
    const int ok[HC_DIMS] = {
        [HC_N] = n >= 1 && n <= MAX_N,
        [HC_TOKENS] = T >= 1 && T <= MAX_TOKENS,
        [HC_WIDTH] = C >= 1 && C <= MAX_WIDTH,
        [HC_THREADS] = dims[HC_THREADS] >= 1 && dims[HC_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < HC_DIMS; k++)
        if (!ok[k]) return MHC_BAD_DIM + k;
    if (count != HC_BUFFERS) return MHC_BAD_BUFFER + HC_BUFFERS;
    int64_t K = n * (n + 2), tnc; /* T n C can reach 2^63 within the bounds above */
    if (__builtin_mul_overflow(T, n * C, &tnc) || tnc > INT64_MAX / 8) return MHC_BAD_BUFFER + HC_X;
    const int64_t want[HC_BUFFERS] = {tnc, C, C, (n + 2) * C, K, K, K * T};
    for (int k = 0; k < HC_BUFFERS; k++)
        if (!bufs[k] || sizes[k] != want[k]) return MHC_BAD_BUFFER + k;
    return MHC_OK;
}

static void hc_rows(const float *restrict x, const float *restrict g, const float *restrict b,
                    const float *restrict w, const float *restrict stat, const float *restrict scale,
                    float *restrict out, int64_t T, int n, int64_t C, float eps, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++)
        for (int j = 0; j < n; j++) {
            const float *row = x + (t * n + j) * C;
            vec s = {0}, acc[MAX_N + 2];
            float mean = 0.0f, var = 0.0f, tail[MAX_N + 2] = {0};
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
            float rstd = 1.0f / sqrtf(var / (float)C + eps);
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
                out[(o * n + j) * T + t] = z;
            }
        }
    /* libm's tanhf, not a vectorised polynomial: one within 2 ulp moved the golden checkpoints' scores by 4 ulp
     * (tests/test_golden_models.py holds them to 1e-6); tanhf kept them, at about 10 us of a decoding call */
    for (int k = 0; k < n * (n + 2); k++)
        for (int64_t t = t0; t < t1; t++) out[k * T + t] = stat[k] + scale[k] * tanhf(out[k * T + t]);
}

/* out (K, T) of the streams x (T, n, C). dims: n, tokens, C, threads; eps: the LayerNorm's. */
int hc_coefficients(const int64_t *dims, float eps, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_hc(dims, bufs, sizes, count);
    if (err) return err;
    int n = (int)dims[HC_N], threads = mix_threads(dims); /* HC_* dims are MIX_*'s first four */
    int64_t T = dims[HC_TOKENS], C = dims[HC_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        hc_rows(bufs[HC_X], bufs[HC_G], bufs[HC_B], bufs[HC_W], bufs[HC_STATIC], bufs[HC_SCALE], bufs[HC_OUT], T, n, C,
                eps, T * id / all, T * (id + 1) / all);
    }
    return MHC_OK;
}

/* The rest of a decoding step's mHC coefficients in one call, included by mhc_cpu.c (after mhc_mix.c).
 *
 * Without autograd, after the product raw = (gain phi)^T v^T (K, T) that the caller leaves to torch's matrix
 * product (MKL; a blocked loop here was not faster: not worth its code), per token: scale =
 * 1 / sqrt(mean(v^2) + eps), logits = b + (raw scale) a (a: a_pre, a_post, a_res per coefficient), then the gates
 * of mhc_forward in place. In PyTorch that is eight operator calls per unit (mean square, rsqrt, product by
 * the scale, the gates' gather, addcmul, ...), each a few microseconds for a decoding step's 80 tokens: the time
 * is the calls. Same operations in the same order as modules/mhc.py (the mean square summed in another order:
 * float32 rounding).
 *
 * Layout: v (T, N) token-major (the streams flattened, N = n C), raw (K, T), bias (K), gates (3); out (K, T):
 * the logits, then (unless the log domain is needed) [H_pre; H_post; H_res] in place.
 *
 * mHC-lite (mhc_lite_coefficients): the same with n! residual logits, raw and bias (2n + n!), whose softmax
 * weighs the n! permutation matrices into H_res (no iteration, no log domain); out is mHC's (2n + n^2, T).
 */

enum { CO_N, CO_TOKENS, CO_WIDTH, CO_ITERS, CO_THREADS, CO_DIMS };
enum { CO_V, CO_RAW, CO_BIAS, CO_GATES, CO_OUT, CO_BUFFERS };

#define MAX_LITE_N 5 /* mHC-lite: n! coefficients, 120 at n = 5 */

static int64_t factorial(int64_t n) { return n <= 1 ? 1 : n * factorial(n - 1); }

/* mHC's (lite = 0) or mHC-lite's (lite = 1, n! residual logits in; H_res's n^2 entries out) dims and buffers */
static int check_coef(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count, int lite) {
    int64_t n = dims[CO_N], T = dims[CO_TOKENS], C = dims[CO_WIDTH];
    const int ok[CO_DIMS] = {
        [CO_N] = n >= 1 && n <= (lite ? MAX_LITE_N : MAX_N),
        [CO_TOKENS] = T >= 1 && T <= MAX_TOKENS,
        [CO_WIDTH] = C >= 1 && C <= MAX_WIDTH,
        [CO_ITERS] = dims[CO_ITERS] >= 1 && dims[CO_ITERS] <= MAX_ITERS,
        [CO_THREADS] = dims[CO_THREADS] >= 1 && dims[CO_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < CO_DIMS; k++)
        if (!ok[k]) return MHC_BAD_DIM + k;
    if (count != CO_BUFFERS) return MHC_BAD_BUFFER + CO_BUFFERS;
    int64_t K = 2 * n + n * n, K_in = lite ? 2 * n + factorial(n) : K, tnc;
    if (__builtin_mul_overflow(T, n * C, &tnc) || tnc > INT64_MAX / 8) return MHC_BAD_BUFFER + CO_V;
    const int64_t want[CO_BUFFERS] = {tnc, K_in * T, K_in, 3, K * T};
    for (int k = 0; k < CO_BUFFERS; k++)
        if (!bufs[k] || sizes[k] != want[k]) return MHC_BAD_BUFFER + k;
    return MHC_OK;
}

/* the logits of tokens [t0, t1) into out (K, T) (mHC) */
static void coef_logits(const float *restrict v, const float *restrict raw, const float *restrict bias,
                        const float *restrict gates, float *restrict out, int64_t T, int n, int64_t N, float eps,
                        int64_t t0, int64_t t1) {
    int K = 2 * n + n * n;
    for (int64_t t = t0; t < t1; t++) {
        const float *vt = v + t * N;
        float scale = 1.0f / sqrtf(dot(vt, vt, N) / (float)N + eps); /* in LANES partial sums (mhc_mix.c) */
        /* one loop per gate, not gates[k < n ? 0 : ...] in one: GCC 12 with -march=native (AVX-512) and -fopenmp
         * vectorised that loop wrongly in lite_tokens (H_pre's first logit came out 0) */
        for (int k = 0; k < n; k++) out[k * T + t] = bias[k] + raw[k * T + t] * scale * gates[0];
        for (int k = n; k < 2 * n; k++) out[k * T + t] = bias[k] + raw[k * T + t] * scale * gates[1];
        for (int k = 2 * n; k < K; k++) out[k * T + t] = bias[k] + raw[k * T + t] * scale * gates[2];
    }
}

/* the n! permutations of 0 .. n-1 in lexicographic order (itertools.permutations' order, mhc.py's index) */
static void permutations(int n, int *perms) {
    int p[MAX_LITE_N];
    for (int i = 0; i < n; i++) p[i] = i;
    for (int64_t k = 0, count = factorial(n); k < count; k++) {
        memcpy(perms + k * n, p, sizeof(int) * (size_t)n);
        int i = n - 2, j = n - 1; /* the next permutation: the standard algorithm */
        while (i >= 0 && p[i] >= p[i + 1]) i--;
        if (i < 0) break;
        while (p[j] <= p[i]) j--;
        int swap = p[i];
        p[i] = p[j], p[j] = swap;
        for (int a = i + 1, b = n - 1; a < b; a++, b--) swap = p[a], p[a] = p[b], p[b] = swap;
    }
}

/* mHC-lite, tokens [t0, t1): the H_pre and H_post logits into out's first 2n rows (the gates follow in place);
 * H_res = sum_k a_k P_k, a = softmax of the n! residual logits (max subtracted, as PyTorch's softmax), P_k's
 * entry (i, perm_k[i]) = 1 */
static void lite_tokens(const float *restrict v, const float *restrict raw, const float *restrict bias,
                        const float *restrict gates, float *restrict out, int64_t T, int n, int64_t N, float eps,
                        const int *perms, int64_t t0, int64_t t1) {
    int nf = (int)factorial(n);
    float a[120], res[MAX_LITE_N * MAX_LITE_N];
    for (int64_t t = t0; t < t1; t++) {
        const float *vt = v + t * N;
        float scale = 1.0f / sqrtf(dot(vt, vt, N) / (float)N + eps);
        for (int k = 0; k < n; k++) out[k * T + t] = bias[k] + raw[k * T + t] * scale * gates[0]; /* as coef_logits */
        for (int k = n; k < 2 * n; k++) out[k * T + t] = bias[k] + raw[k * T + t] * scale * gates[1];
        float top = -INFINITY, total = 0.0f;
        for (int k = 0; k < nf; k++) {
            a[k] = bias[2 * n + k] + raw[(2 * n + k) * T + t] * scale * gates[2];
            top = a[k] > top ? a[k] : top;
        }
        if (!isfinite(top)) top = 0.0f; /* all -inf (or an inf or NaN): as PyTorch, NaN or 0 / 0 follow */
        for (int k = 0; k < nf; k++) total += a[k] = expf(a[k] - top);
        memset(res, 0, sizeof res);
        for (int k = 0; k < nf; k++)
            for (int i = 0; i < n; i++) res[i * n + perms[k * n + i]] += a[k] / total;
        for (int e = 0; e < n * n; e++) out[(2 * n + e) * T + t] = res[e];
    }
}

/* out (K, T) = [H_pre; H_post; H_res] of the streams v and their products raw; MHC_LOG_DOMAIN (out then holds
 * the logits) for logits the exp-then-divide iteration cannot take. dims: n, tokens, C, iters, threads; eps:
 * the RMSNorm's. */
int mhc_coefficients(const int64_t *dims, float eps, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_coef(dims, bufs, sizes, count, 0);
    if (err) return err;
    int n = (int)dims[CO_N], iters = (int)dims[CO_ITERS];
    int64_t T = dims[CO_TOKENS], N = n * dims[CO_WIDTH];
    float *out = bufs[CO_OUT];
    int threads = threads_for(T, dims[CO_THREADS]);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t t0, t1;
        token_range(T, THREAD_ID, THREAD_COUNT, &t0, &t1);
        if (t0 < t1) coef_logits(bufs[CO_V], bufs[CO_RAW], bufs[CO_BIAS], bufs[CO_GATES], out, T, n, N, eps, t0, t1);
    }
    if (domain(out + 2 * n * T, n * n * T)) return MHC_LOG_DOMAIN;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t t0, t1;
        token_range(T, THREAD_ID, THREAD_COUNT, &t0, &t1);
        if (t0 < t1) forward_any(out, out, T, n, iters, t0, t1); /* in place: each value is read before written */
    }
    return MHC_OK;
}

/* mHC-lite: out (2n + n^2, T) = [H_pre; H_post; H_res] of the streams v and their products raw (2n + n!, T) with
 * the learned bias (2n + n!). dims as mhc_coefficients' (iters unused, 1 to MAX_ITERS), n <= MAX_LITE_N. */
int mhc_lite_coefficients(const int64_t *dims, float eps, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_coef(dims, bufs, sizes, count, 1);
    if (err) return err;
    int n = (int)dims[CO_N], perms[120 * MAX_LITE_N];
    int64_t T = dims[CO_TOKENS], N = n * dims[CO_WIDTH];
    permutations(n, perms);
    float *out = bufs[CO_OUT];
    int threads = threads_for(T, dims[CO_THREADS]);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t t0, t1;
        token_range(T, THREAD_ID, THREAD_COUNT, &t0, &t1);
        if (t0 < t1) {
            lite_tokens(bufs[CO_V], bufs[CO_RAW], bufs[CO_BIAS], bufs[CO_GATES], out, T, n, N, eps, perms, t0, t1);
            forward_gates(out, out, T, n, t0, t1); /* the sigmoids, in place */
        }
    }
    return MHC_OK;
}

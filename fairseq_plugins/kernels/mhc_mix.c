/* The mHC mixing loops, included by mhc_cpu.c (which checks every argument before calling them).
 *
 * Per token, u = H_pre x (C floats) and mixed = H_res x (n x C) from the token's n streams x (n x C), and the
 * gradients back. In PyTorch this is a bmm of 1000 tiny (n + 1, n) x (n, C) products (2 GFLOP/s: its time
 * is the per-matrix overhead), a cat to build the (n + 1, n) matrices, and backward two more bmm and a cat of
 * the split gradients: about half of an mHC unit's training time. Here one pass over the tokens reads the
 * streams once and writes the results once (the token's 4 KB of streams stay in L1), vectorised over C.
 *
 * Layout: x (T, n, C) and mixed (T, n, C) token-major (the model's (seq, batch, n, C) flattened), u (T, C),
 * the coefficients (K, T) tokens last as the gate kernel wrote them: H_pre rows [0, n), H_res rows
 * [2n, 2n + n^2) (entry (i, j) at row 2n + i n + j); H_post's rows are not read, and get a zero gradient.
 */

/* the (n + 1, n) mixing matrix of token t: row 0 is H_pre, rows 1 + i are H_res's rows */
static inline INLINE void mix_matrix(const float *coef, int64_t T, int n, int64_t t, float *w) {
    for (int j = 0; j < n; j++) w[j] = coef[j * T + t];
    for (int e = 0; e < n * n; e++) w[n + e] = coef[(2 * n + e) * T + t];
}

/* sum_c a[c] b[c], in LANES partial sums (the order differs from a bmm's by rounding only) */
static inline INLINE float dot(const float *a, const float *b, int64_t C) {
    vec s = {0};
    int64_t c = 0;
    for (; c + LANES <= C; c += LANES) s += load(a + c, LANES, 0.0f) * load(b + c, LANES, 0.0f);
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += s[l];
    for (; c < C; c++) total += a[c] * b[c];
    return total;
}

static void mix_tokens(const float *restrict x, const float *restrict coef, float *restrict u,
                       float *restrict mixed, int64_t T, int n, int64_t C, int64_t t0, int64_t t1) {
    float w[(MAX_N + 1) * MAX_N];
    for (int64_t t = t0; t < t1; t++) {
        const float *xt = x + t * n * C;
        mix_matrix(coef, T, n, t, w);
        for (int o = 0; o <= n; o++) {
            float *restrict dst = o == 0 ? u + t * C : mixed + (t * n + o - 1) * C;
            const float *wo = w + o * n;
            for (int64_t c = 0; c < C; c++) dst[c] = wo[0] * xt[c];
            for (int j = 1; j < n; j++)
                for (int64_t c = 0; c < C; c++) dst[c] += wo[j] * xt[j * C + c];
        }
    }
}

/* the LANES partial sums of dot(), finished as dot() finishes them (lanes in order, then the tail) */
static inline INLINE float finish(vec s, const float *a, const float *b, int64_t c, int64_t C) {
    float total = 0.0f;
    for (int l = 0; l < LANES; l++) total += s[l];
    for (; c < C; c++) total += a[c] * b[c];
    return total;
}

/* grad_x = H_pre^T grad_u + H_res^T grad_mixed; grad_coef: H_pre's rows sum_c grad_u x_j, H_res's
 * sum_c grad_mixed_i x_j, H_post's zero. Per stream j one pass over C computes grad_x_j and the n + 1 dot
 * products with x_j together: n + 1 independent chains of vector additions (one dot at a time, each waited on
 * its own additions' latency: most of the backward's time before), each summed as dot() sums */
static void mix_backward_tokens(const float *restrict x, const float *restrict coef, const float *restrict grad_u,
                                const float *restrict grad_mixed, float *restrict grad_x, float *restrict grad_coef,
                                int64_t T, int n, int64_t C, int64_t t0, int64_t t1) {
    float w[(MAX_N + 1) * MAX_N];
    for (int64_t t = t0; t < t1; t++) {
        const float *xt = x + t * n * C, *gu = grad_u + t * C, *gm = grad_mixed + t * n * C;
        mix_matrix(coef, T, n, t, w);
        for (int j = 0; j < n; j++) {
            const float *xj = xt + j * C;
            float *restrict gx = grad_x + (t * n + j) * C;
            vec acc[MAX_N + 1];
            for (int i = 0; i <= n; i++) acc[i] = (vec){0};
            int64_t c = 0;
            for (; c + LANES <= C; c += LANES) {
                vec xv = load(xj + c, LANES, 0.0f), g = load(gu + c, LANES, 0.0f);
                vec sum = w[j] * g;
                acc[0] += g * xv;
                for (int i = 0; i < n; i++) {
                    vec gi = load(gm + i * C + c, LANES, 0.0f);
                    sum += w[n + i * n + j] * gi;
                    acc[1 + i] += gi * xv;
                }
                store(gx + c, sum, LANES);
            }
            for (int64_t r = c; r < C; r++) {
                float sum = w[j] * gu[r];
                for (int i = 0; i < n; i++) sum += w[n + i * n + j] * gm[i * C + r];
                gx[r] = sum;
            }
            grad_coef[j * T + t] = finish(acc[0], gu, xj, c, C);
            grad_coef[(n + j) * T + t] = 0.0f;
            for (int i = 0; i < n; i++) grad_coef[(2 * n + i * n + j) * T + t] = finish(acc[1 + i], gm + i * C, xj, c, C);
        }
    }
}

enum { MIX_N, MIX_TOKENS, MIX_WIDTH, MIX_THREADS, MIX_DIMS };
enum { MF_X, MF_COEF, MF_U, MF_MIXED, MIX_FORWARD_BUFFERS };
enum { MB_X, MB_COEF, MB_GRAD_U, MB_GRAD_MIXED, MB_GRAD_X, MB_GRAD_COEF, MIX_BACKWARD_BUFFERS };
#define MAX_WIDTH ((int64_t)1 << 24)
#define MIN_MIX_WORK_PER_THREAD ((int64_t)1 << 18) /* floats of streams: decoding's 80 tokens stay on one */

/* the dims (as check_dims) and every buffer present with its exact length: streams-sized (T n C), u-sized
 * (T C), coefficient-sized (K T) or H_post-sized (n T), per `kinds` ('s', 'u', 'k', 'p'; mhc_post.c too) */
static int check_mix(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count, const char *kinds) {
    int64_t n = dims[MIX_N], T = dims[MIX_TOKENS], C = dims[MIX_WIDTH];
    const int ok[MIX_DIMS] = {
        [MIX_N] = n >= 1 && n <= MAX_N,
        [MIX_TOKENS] = T >= 1 && T <= MAX_TOKENS,
        [MIX_WIDTH] = C >= 1 && C <= MAX_WIDTH,
        [MIX_THREADS] = dims[MIX_THREADS] >= 1 && dims[MIX_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < MIX_DIMS; k++)
        if (!ok[k]) return MHC_BAD_DIM + k;
    int want = (int)strlen(kinds);
    if (count != want) return MHC_BAD_BUFFER + want;
    int64_t tn, tnc; /* T n C can reach 2^63 within the bounds above: a size that overflows fits no buffer */
    if (__builtin_mul_overflow(T, n, &tn) || __builtin_mul_overflow(tn, C, &tnc) || tnc > INT64_MAX / 8)
        return MHC_BAD_BUFFER;
    for (int k = 0; k < want; k++) { /* T C, K T and n T are below T n C and 2^40 */
        char kind = kinds[k];
        int64_t size = kind == 's' ? tnc : kind == 'u' ? T * C : kind == 'p' ? n * T : (2 * n + n * n) * T;
        if (!bufs[k] || sizes[k] != size) return MHC_BAD_BUFFER + k;
    }
    return MHC_OK;
}

static int mix_threads(const int64_t *dims) {
    int64_t work = dims[MIX_TOKENS] * dims[MIX_N] * dims[MIX_WIDTH], t = work / MIN_MIX_WORK_PER_THREAD;
    t = t < dims[MIX_THREADS] ? t : dims[MIX_THREADS];
    t = t < dims[MIX_TOKENS] ? t : dims[MIX_TOKENS];
    return t < 1 ? 1 : (int)t;
}

/* u (T, C) = H_pre x and mixed (T, n, C) = H_res x of the streams x (T, n, C) and coefficients (K, T) */
int mhc_mix_forward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_mix(dims, bufs, sizes, count, "skus");
    if (err) return err;
    int n = (int)dims[MIX_N], threads = mix_threads(dims);
    int64_t T = dims[MIX_TOKENS], C = dims[MIX_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        mix_tokens(bufs[MF_X], bufs[MF_COEF], bufs[MF_U], bufs[MF_MIXED], T, n, C, T * id / all, T * (id + 1) / all);
    }
    return MHC_OK;
}

/* grad_x (T, n, C) and grad_coef (K, T) from grad_u (T, C) and grad_mixed (T, n, C) */
int mhc_mix_backward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_mix(dims, bufs, sizes, count, "skussk");
    if (err) return err;
    int n = (int)dims[MIX_N], threads = mix_threads(dims);
    int64_t T = dims[MIX_TOKENS], C = dims[MIX_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        mix_backward_tokens(bufs[MB_X], bufs[MB_COEF], bufs[MB_GRAD_U], bufs[MB_GRAD_MIXED], bufs[MB_GRAD_X],
                            bufs[MB_GRAD_COEF], T, n, C, T * id / all, T * (id + 1) / all);
    }
    return MHC_OK;
}

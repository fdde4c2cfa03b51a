/* Fused float32 CPU kernel of mHC's coefficient gates (fairseq_plugins/modules/mhc.py has the equations).
 *
 * From the logits (K, tokens), K = 2n + n^2 (tokens last, the layout mhc.py computes them in), it computes
 * H_pre = sigmoid, H_post = 2 sigmoid and H_res = Sinkhorn(exp(.)) with `iters` x (columns, then rows), and the
 * gradient of all three with respect to the logits. In PyTorch the Sinkhorn alone is 80 operator calls per
 * unit forward and as many backward, each over a few floats per token: the cost is the calls, not the maths.
 * Here a block of LANES tokens is loaded into a local (n^2, LANES) array and the whole iteration runs on it
 * (the loops over the lanes are what the compiler vectorises); backward recomputes the iterates per block into
 * a per-thread scratch (about 20 KB for n = 4, 20 iterations), so nothing but the logits is saved.
 *
 * Same operations in the same order as mhc.py's _Normalisations (sums in index order, true divisions, the
 * backward's (g - sum(g y)) / s), so the results agree with the PyTorch code to float32 rounding (the exp and
 * sigmoid of libm and of PyTorch differ by an ulp). Logits the exp-then-divide iteration cannot take
 * (|x| > MAX_EXP_LOGIT, mhc.py says why) are reported with MHC_LOG_DOMAIN before anything is written, and the
 * caller runs PyTorch's log-domain iteration; NaN logits are not (as in mhc.py, whose amax is then NaN).
 * mhc_mix.c (included at the end) has the per-token mixing with the streams that the coefficients feed.
 * Plain C called through ctypes by kernels/mhc_kernel.py, which owns every allocation; built and verified by
 * kernels/loader.py like the GRN kernels. Parallel over token blocks with OpenMP on the caller's threads.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

enum { DIM_N, DIM_TOKENS, DIM_ITERS, DIM_THREADS, DIMS };
enum { F_LOGITS, F_OUT, FORWARD_BUFFERS };
enum { B_LOGITS, B_GRAD, B_GRAD_LOGITS, BACKWARD_BUFFERS };
#define MHC_OK 0
#define MHC_NO_MEMORY (-1)
#define MHC_LOG_DOMAIN 1   /* logits too large for exp-then-divide: nothing written, run the log domain */
#define MHC_BAD_DIM 10     /* + the index of the bad dimension */
#define MHC_BAD_BUFFER 100 /* + the index of the bad buffer; MHC_BAD_BUFFER + count: a bad count */
#define MAX_N 8            /* streams: (n^2, LANES) floats stay in L1 */
#define MAX_ITERS 1000     /* the backward's scratch is 2 iters (n^2 + n) LANES floats a thread */
#define MAX_TOKENS ((int64_t)1 << 36)
#define MAX_THREADS 1024
#define MAX_EXP_LOGIT 15.0f /* mhc.py's MAX_EXP_LOGIT */
#define LANES 8             /* tokens per block: one AVX2 register of floats */
#define MIN_TOKENS_PER_THREAD 2048 /* fewer, and waking a thread costs more than it saves (decoding: 80) */

/* the block functions are inlined into a copy for n = 4 (mHC's n), where the compiler unrolls every loop */
#define INLINE __attribute__((always_inline))

int mhc_abi_version(void) { return 7; }

static int check_dims(const int64_t *dims) {
    const int ok[DIMS] = {
        [DIM_N] = dims[DIM_N] >= 1 && dims[DIM_N] <= MAX_N,
        [DIM_TOKENS] = dims[DIM_TOKENS] >= 1 && dims[DIM_TOKENS] <= MAX_TOKENS,
        [DIM_ITERS] = dims[DIM_ITERS] >= 1 && dims[DIM_ITERS] <= MAX_ITERS,
        [DIM_THREADS] = dims[DIM_THREADS] >= 1 && dims[DIM_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < DIMS; k++)
        if (!ok[k]) return MHC_BAD_DIM + k;
    return MHC_OK;
}

/* every buffer present with exactly K x tokens floats (the bounds above keep the product far from overflow) */
static int check_buffers(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count, int want) {
    if (count != want) return MHC_BAD_BUFFER + want;
    int64_t n = dims[DIM_N], size = (2 * n + n * n) * dims[DIM_TOKENS];
    for (int k = 0; k < want; k++)
        if (!bufs[k] || sizes[k] != size) return MHC_BAD_BUFFER + k;
    return MHC_OK;
}

/* MHC_LOG_DOMAIN if a residual logit has |x| > MAX_EXP_LOGIT and none is NaN (mhc.py's test, amax > 15) */
static int domain(const float *res_logits, int64_t size) {
    int big = 0, nan = 0;
    for (int64_t k = 0; k < size; k++) {
        big |= fabsf(res_logits[k]) > MAX_EXP_LOGIT;
        nan |= isnan(res_logits[k]);
    }
    return big && !nan ? MHC_LOG_DOMAIN : MHC_OK;
}

static int threads_for(int64_t tokens, int64_t threads) {
    int64_t t = tokens / MIN_TOKENS_PER_THREAD;
    return (int)(t < 1 ? 1 : (t < threads ? t : threads));
}

/* One vector of LANES tokens (GCC/Clang vector extensions: AVX2/AVX-512 registers with -march=native, lowered
 * to narrower ones elsewhere); a block of the (n, n) matrices is n^2 of them. */
typedef float vec __attribute__((vector_size(sizeof(float) * LANES)));

static inline INLINE vec load(const float *row, int count, float pad) {
    vec v;
    if (count == LANES) {
        memcpy(&v, row, sizeof(vec));
    } else {
        for (int l = 0; l < LANES; l++) v[l] = l < count ? row[l] : pad;
    }
    return v;
}

static inline INLINE void store(float *row, vec v, int count) {
    if (count == LANES)
        memcpy(row, &v, sizeof(vec));
    else
        for (int l = 0; l < count; l++) row[l] = v[l];
}

typedef int32_t ivec __attribute__((vector_size(sizeof(int32_t) * LANES)));

/* mask ? a : b lane by lane (C has no vector ?:); mask lanes are all ones or all zeros, as comparisons give */
static inline INLINE vec pick(ivec mask, vec a, vec b) { return (vec)((mask & (ivec)a) | (~mask & (ivec)b)); }

/* exp of every lane, vectorised (libm's expf is a call per float: half the kernel's time before). Cephes'
 * expf: x = k ln 2 + r, |r| <= ln 2 / 2, e^r by its degree-7 polynomial (within 1 ulp, as PyTorch's own vector
 * exp), times 2^k as two factors 2^(k/2) and 2^(k - k/2) so that results overflow to inf and underflow
 * gradually to 0 as expf's do. NaN lanes come back NaN (they are computed as 0, then put back). */
static inline INLINE vec exp_vec(vec x) {
    const vec lo = (vec){0} - 104.0f, hi = (vec){0} + 89.0f; /* beyond: 0 and inf whatever the rounding */
    ivec nan = x != x;
    vec xc = pick(nan, (vec){0}, x);
    xc = pick(xc < lo, lo, xc);
    xc = pick(xc > hi, hi, xc);
    const float round = 12582912.0f; /* 1.5 * 2^23: adding and subtracting it rounds to an integer */
    vec k = (xc * 1.44269504088896341f + round) - round;
    vec r = xc - k * 0.693359375f - k * -2.12194440e-4f;
    vec p = 1.9875691500e-4f * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    ivec ki = __builtin_convertvector(k, ivec), k1 = ki >> 1, k2 = ki - k1;
    vec s1 = (vec)((k1 + 127) << 23), s2 = (vec)((k2 + 127) << 23);
    return pick(nan, x, p * s1 * s2);
}

static inline INLINE vec sigmoid_vec(vec x) { return 1.0f / (1.0f + exp_vec(-x)); }

/* m = exp of rows [2n, K) of the logits for tokens t0 .. t0 + count (missing lanes: exp(0)) */
static inline INLINE void load_exp(const float *logits, int64_t T, int n, int64_t t0, int count, vec *m) {
    for (int e = 0; e < n * n; e++) m[e] = exp_vec(load(logits + (2 * n + e) * T + t0, count, 0.0f));
}

/* iters x (T_c, then T_r) of m in place: step 2k divides by the column sums (over i), step 2k + 1 by the row
 * sums (over j), summed in index order as PyTorch's sum over a non-innermost dimension; with `saved`, each
 * step's result (n^2 vectors) and sums (n) go to saved[step] */
static inline INLINE void normalise(vec *m, int n, int iters, vec *saved) {
    vec local[MAX_N];
    int nn = n * n;
    for (int step = 0; step < 2 * iters; step++) {
        int axis = step & 1;
        vec *s = saved ? saved + step * (nn + n) + nn : local;
        for (int a = 0; a < n; a++) s[a] = (vec){0};
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) s[axis ? i : j] += m[i * n + j];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) m[i * n + j] /= s[axis ? i : j];
        if (saved) memcpy(saved + step * (nn + n), m, sizeof(vec) * (size_t)nn);
    }
}

/* g := the gradient of the normalisations' input, from g of their output: for y = x / s along an axis,
 * dx = (dy - sum(dy y)) / s along the same axis, steps in reverse */
static inline INLINE void normalise_backward(vec *g, int n, int iters, const vec *saved) {
    vec dot[MAX_N];
    int nn = n * n;
    for (int step = 2 * iters - 1; step >= 0; step--) {
        int axis = step & 1;
        const vec *y = saved + step * (nn + n), *s = y + nn;
        for (int a = 0; a < n; a++) dot[a] = (vec){0};
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) dot[axis ? i : j] += g[i * n + j] * y[i * n + j];
        for (int i = 0; i < n; i++)
            for (int j = 0; j < n; j++) g[i * n + j] = (g[i * n + j] - dot[axis ? i : j]) / s[axis ? i : j];
    }
}

static inline INLINE void forward_gates(const float *logits, float *out, int64_t T, int n, int64_t t0, int64_t t1) {
    for (int k = 0; k < 2 * n; k++) {
        float scale = k < n ? 1.0f : 2.0f; /* H_pre = sigmoid, H_post = 2 sigmoid */
        for (int64_t b = t0; b < t1; b += LANES) {
            int count = t1 - b < LANES ? (int)(t1 - b) : LANES;
            store(out + k * T + b, scale * sigmoid_vec(load(logits + k * T + b, count, 0.0f)), count);
        }
    }
}

static inline INLINE void forward_tokens(const float *logits, float *out, int64_t T, int n, int iters, int64_t t0,
                                         int64_t t1) {
    vec m[MAX_N * MAX_N];
    forward_gates(logits, out, T, n, t0, t1);
    for (int64_t b = t0; b < t1; b += LANES) {
        int count = t1 - b < LANES ? (int)(t1 - b) : LANES;
        load_exp(logits, T, n, b, count, m);
        normalise(m, n, iters, NULL);
        for (int e = 0; e < n * n; e++) store(out + (2 * n + e) * T + b, m[e], count);
    }
}

static inline INLINE void backward_tokens(const float *logits, const float *grad, float *grad_logits, int64_t T,
                                          int n, int iters, int64_t t0, int64_t t1, vec *saved) {
    vec m0[MAX_N * MAX_N], m[MAX_N * MAX_N], g[MAX_N * MAX_N];
    for (int k = 0; k < 2 * n; k++) /* sigmoid' = y (1 - y); H_post's factor 2 on the incoming gradient */
        for (int64_t b = t0; b < t1; b += LANES) {
            int count = t1 - b < LANES ? (int)(t1 - b) : LANES;
            vec y = sigmoid_vec(load(logits + k * T + b, count, 0.0f));
            vec dy = (k < n ? 1.0f : 2.0f) * load(grad + k * T + b, count, 0.0f);
            store(grad_logits + k * T + b, dy * (1.0f - y) * y, count);
        }
    int nn = n * n;
    for (int64_t b = t0; b < t1; b += LANES) {
        int count = t1 - b < LANES ? (int)(t1 - b) : LANES;
        load_exp(logits, T, n, b, count, m0);
        memcpy(m, m0, sizeof(vec) * (size_t)nn);
        normalise(m, n, iters, saved); /* recomputed, not saved by forward */
        for (int e = 0; e < nn; e++) g[e] = load(grad + (2 * n + e) * T + b, count, 0.0f);
        normalise_backward(g, n, iters, saved);
        for (int e = 0; e < nn; e++) store(grad_logits + (2 * n + e) * T + b, g[e] * m0[e], count); /* exp' = exp */
    }
}

/* n = 4 as a constant: every loop unrolled, the (16, LANES) block held in vector registers */
static void forward_4(const float *logits, float *out, int64_t T, int iters, int64_t t0, int64_t t1) {
    forward_tokens(logits, out, T, 4, iters, t0, t1);
}

static void backward_4(const float *logits, const float *grad, float *grad_logits, int64_t T, int iters,
                       int64_t t0, int64_t t1, vec *saved) {
    backward_tokens(logits, grad, grad_logits, T, 4, iters, t0, t1, saved);
}

static void forward_any(const float *logits, float *out, int64_t T, int n, int iters, int64_t t0, int64_t t1) {
    if (n == 4)
        forward_4(logits, out, T, iters, t0, t1);
    else
        forward_tokens(logits, out, T, n, iters, t0, t1);
}

static void backward_any(const float *logits, const float *grad, float *grad_logits, int64_t T, int n, int iters,
                         int64_t t0, int64_t t1, vec *saved) {
    if (n == 4)
        backward_4(logits, grad, grad_logits, T, iters, t0, t1, saved);
    else
        backward_tokens(logits, grad, grad_logits, T, n, iters, t0, t1, saved);
}

/* the token range [t0, t1) of thread `id` of `count`, in whole blocks */
static void token_range(int64_t T, int id, int count, int64_t *t0, int64_t *t1) {
    int64_t blocks = (T + LANES - 1) / LANES;
    *t0 = blocks * id / count * LANES;
    *t1 = blocks * (id + 1) / count * LANES;
    if (*t1 > T) *t1 = T;
}

#ifdef _OPENMP
#define THREAD_ID omp_get_thread_num()
#define THREAD_COUNT omp_get_num_threads()
#else
#define THREAD_ID 0
#define THREAD_COUNT 1
#endif

/* out (K, tokens) = [H_pre; H_post; H_res] of logits (K, tokens). dims: n, tokens, iters, threads. */
int mhc_forward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_dims(dims);
    if (!err) err = check_buffers(dims, bufs, sizes, count, FORWARD_BUFFERS);
    if (err) return err;
    int n = (int)dims[DIM_N], iters = (int)dims[DIM_ITERS];
    int64_t T = dims[DIM_TOKENS];
    const float *logits = bufs[F_LOGITS];
    float *out = bufs[F_OUT];
    if (domain(logits + 2 * n * T, n * n * T)) return MHC_LOG_DOMAIN;
    int threads = threads_for(T, dims[DIM_THREADS]);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int64_t t0, t1;
        token_range(T, THREAD_ID, THREAD_COUNT, &t0, &t1);
        if (t0 < t1) forward_any(logits, out, T, n, iters, t0, t1);
    }
    return MHC_OK;
}

/* grad_logits (K, tokens) from grad (K, tokens) of forward's out, recomputing forward from the logits. */
int mhc_backward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_dims(dims);
    if (!err) err = check_buffers(dims, bufs, sizes, count, BACKWARD_BUFFERS);
    if (err) return err;
    int n = (int)dims[DIM_N], iters = (int)dims[DIM_ITERS];
    int64_t T = dims[DIM_TOKENS];
    const float *logits = bufs[B_LOGITS], *grad = bufs[B_GRAD];
    float *grad_logits = bufs[B_GRAD_LOGITS];
    if (domain(logits + 2 * n * T, n * n * T)) return MHC_LOG_DOMAIN;
    int threads = threads_for(T, dims[DIM_THREADS]), status = MHC_OK;
    size_t scratch = sizeof(vec) * (size_t)(2 * iters * (n * n + n)); /* a multiple of the alignment */
#pragma omp parallel num_threads(threads) if (threads > 1) reduction(min : status)
    {
        vec *saved = aligned_alloc(sizeof(vec), scratch);
        int64_t t0, t1;
        token_range(T, THREAD_ID, THREAD_COUNT, &t0, &t1);
        if (!saved)
            status = MHC_NO_MEMORY;
        else if (t0 < t1)
            backward_any(logits, grad, grad_logits, T, n, iters, t0, t1, saved);
        free(saved);
    }
    return status;
}

#include "mhc_mix.c" /* the mixing H_pre x, H_res x and its backward: mhc_mix_forward, mhc_mix_backward */
#include "mhc_coef.c" /* a decoding step's coefficients from the streams: mhc_coefficients */
#include "mhc_post.c" /* the depth connection H_res x + H_post^T F and its backward: mhc_post_forward, _backward */
#include "hc_coef.c"  /* dynamic hyper-connections' coefficients: hc_coefficients, hc_coefficients_backward */

/* Fused float32 CPU kernels of the GRN mixing (fairseq_plugins/modules/grn.py has the equations).
 *
 * The pure-PyTorch GRN makes one pass over the tokens for every entry and every elementwise step (gate norm,
 * b + r, products, sums, LayerNorm), each op writing a full-size temporary: memory-bound glue around the
 * matmuls. These kernels walk the tokens once. For one token they read its E entries (E x D floats, in L1),
 * compute the gates, the O mixtures and their LayerNorm, and write the results; backward likewise. Plain C
 * (no torch headers, so it builds in about a second), called through ctypes by kernels/grn_kernel.py, which
 * owns every allocation. Parallel over tokens with OpenMP, on as many threads as the caller passes
 * (torch.get_num_threads()); built without OpenMP, the pragmas are ignored and one thread runs.
 *
 * Layout: the stack comes as up to three chunks (grn.py's list of chunks: the whole stack, or k-DCA's embedding,
 * middle sum and last k), chunk c holding e_c entries of N x D floats one after the other (row-major, each
 * entry's token rows contiguous), E = e_0 + e_1 + e_2 entries in all; b is (O, E, DB)
 * with DB = D (GRN-v2/v3) or 1 (GRN-v1); w is (O, D) or NULL (GRN-v1/v2); the LayerNorm's weight and bias
 * are (D) or NULL. Saved per token: rho (E, N) and dot (O, E, N) (GRN-v3), mean and rstd (O, N) (LayerNorm).
 * O <= MAX_OUTPUTS (DCA's GRNs have 1 or 3; the caller runs the PyTorch code for more).
 * The loops are in grn_loops.c, the checked entry points below.
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "grn_loops.c"

/* The entry points take their sizes in `dims` and every buffer with its length in floats (`sizes`, 0 for
 * NULL), in the order of the enums below, and check them all before touching memory: a bad size, a missing
 * buffer or one given where none belongs returns an error code instead of reading or writing out of bounds.
 * They cannot check that a pointer really holds its stated length or that outputs do not overlap inputs:
 * kernels/grn_kernel.py passes fresh contiguous tensors and their numel(). */
enum { DIM_N, DIM_D, DIM_O, DIM_DB, DIM_E0, DIM_E1, DIM_E2, DIM_LN, DIM_THREADS, DIMS };
enum { F_C0, F_C1, F_C2, F_B, F_W, F_LNW, F_LNB, F_FIRST, F_H, F_MEAN, F_RSTD, F_RHO, F_DOT, FORWARD_BUFFERS };
enum { B_C0, B_C1, B_C2, B_B, B_W, B_LNW, B_GRAD, B_GRAD_FIRST, B_MEAN, B_RSTD, B_RHO, B_DOT, B_G0, B_G1, B_G2,
       B_GRAD_B, B_GRAD_W, B_GRAD_LNW, B_GRAD_LNB, BACKWARD_BUFFERS };
#define GRN_OK 0
#define GRN_NO_MEMORY (-1)
#define GRN_BAD_DIM 1     /* + the index of the bad dimension */
#define GRN_BAD_BUFFER 100 /* + the index of the bad buffer */
#define MAX_DIM ((int64_t)1 << 40)
#define MAX_ENTRIES ((int64_t)1 << 20)
#define MAX_THREADS 1024
/* tokens a thread gets at least (times entries x width): fewer, and waking another thread costs more than it
 * saves (decoding's 80-token calls run on one thread) */
#define MIN_WORK_PER_THREAD ((int64_t)1 << 17)

int grn_abi_version(void) { return 2; }

/* a * b * c, or -1 if it does not fit */
static int64_t prod(int64_t a, int64_t b, int64_t c) {
    int64_t ab, abc;
    if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc) || abc > INT64_MAX / 8) return -1;
    return abc;
}

enum { ABSENT, REQUIRED, OPTIONAL };
/* 0 if buffer k is as `need` says: REQUIRED (non-NULL, exactly `want` floats), ABSENT (NULL, size 0) or
 * OPTIONAL (either); else its error code */
static int check_buffer(void *const *bufs, const int64_t *sizes, int k, int need, int64_t want) {
    int ok = bufs[k] ? need != ABSENT && want > 0 && sizes[k] == want : need != REQUIRED && sizes[k] == 0;
    return ok ? GRN_OK : GRN_BAD_BUFFER + k;
}

/* the same for a pair that comes together (mean and rstd, rho and dot) */
static int check_pair(void *const *bufs, const int64_t *sizes, int k, int need, int64_t want1, int64_t want2) {
    int err = check_buffer(bufs, sizes, k, need, want1);
    if (!err) err = check_buffer(bufs, sizes, k + 1, bufs[k] ? REQUIRED : ABSENT, want2);
    return err;
}

static int check_dims(const int64_t *dims) {
    int64_t D = dims[DIM_D], E = dims[DIM_E0] + dims[DIM_E1] + dims[DIM_E2];
    const int ok[DIMS] = {
        [DIM_N] = dims[DIM_N] >= 1 && dims[DIM_N] <= MAX_DIM,
        [DIM_D] = D >= 1 && D <= MAX_DIM,
        [DIM_O] = dims[DIM_O] >= 1 && dims[DIM_O] <= MAX_OUTPUTS,
        [DIM_DB] = dims[DIM_DB] == 1 || dims[DIM_DB] == D,
        [DIM_E0] = dims[DIM_E0] >= 0 && dims[DIM_E0] <= MAX_ENTRIES && E >= 1,
        [DIM_E1] = dims[DIM_E1] >= 0 && dims[DIM_E1] <= MAX_ENTRIES,
        [DIM_E2] = dims[DIM_E2] >= 0 && dims[DIM_E2] <= MAX_ENTRIES,
        [DIM_LN] = dims[DIM_LN] == 0 || dims[DIM_LN] == 1,
        [DIM_THREADS] = dims[DIM_THREADS] >= 1 && dims[DIM_THREADS] <= MAX_THREADS,
    };
    for (int k = 0; k < DIMS; k++)
        if (!ok[k]) return GRN_BAD_DIM + k;
    return GRN_OK;
}

/* The chunks (and, for backward, their gradients): chunk c is present iff it has entries */
static int check_chunks(void *const *bufs, const int64_t *sizes, int first, const int64_t *dims) {
    for (int c = 0; c < 3; c++) {
        int64_t e = dims[DIM_E0 + c];
        int err = check_buffer(bufs, sizes, first + c, e ? REQUIRED : ABSENT, prod(e, dims[DIM_N], dims[DIM_D]));
        if (err) return err;
    }
    return GRN_OK;
}

static int thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

static int thread_count(void) {
#ifdef _OPENMP
    return omp_get_num_threads();
#else
    return 1;
#endif
}

/* threads worth starting for N tokens, at most `threads` (torch.get_num_threads() of the caller) */
static int threads_for(int64_t N, int64_t E, int64_t D, int64_t threads) {
    int64_t work = prod(N, E, D), t = work < 0 ? threads : work / MIN_WORK_PER_THREAD;
    t = t < threads ? t : threads;
    return t > N ? (int)N : (t < 1 ? 1 : (int)t);
}

/* Pointers to the E entries of the three chunks (see the layout above); NULL if out of memory. */
static float **entry_pointers(float *const *chunks, const int64_t *e, int64_t N, int64_t D) {
    float **p = malloc(sizeof(float *) * (size_t)(e[0] + e[1] + e[2]));
    if (!p) return NULL;
    int64_t j = 0;
    for (int c = 0; c < 3; c++)
        for (int64_t i = 0; i < e[c]; i++) p[j++] = chunks[c] + i * N * D;
    return p;
}

struct grn {
    int64_t N, D, O, DB, E;
    int ln;
    float ln_eps;
    float **entries, **grad_entries;
    const float *b, *w, *ln_w, *ln_b;
};

static int forward_tokens(const struct grn *a, void *const *bufs, int64_t n_begin, int64_t n_end) {
    const int64_t N = a->N, D = a->D, O = a->O, E = a->E;
    const float *w = a->w;
    float *first = bufs[F_FIRST], *h = bufs[F_H], *mean = bufs[F_MEAN], *rstd = bufs[F_RSTD];
    float *rho = bufs[F_RHO], *dot = bufs[F_DOT];
    float *scratch = malloc(sizeof(float) * (size_t)(O * D + 2 * O * E));
    const float **rows = malloc(sizeof(float *) * (size_t)E);
    if (!scratch || !rows) {
        free(scratch);
        free(rows);
        return GRN_NO_MEMORY;
    }
    float *x = scratch, *r = scratch + O * D, *dots = r + O * E;
    for (int64_t n = n_begin; n < n_end; n++) {
        for (int64_t j = 0; j < E; j++) rows[j] = a->entries[j] + n * D;
        if (w) {
            for (int64_t j = 0; j < E; j++) {
                float rh = gate(rows[j], w, D, O, E, j, dots, r);
                if (rho) rho[j * N + n] = rh;
            }
            if (dot)
                for (int64_t i = 0; i < O * E; i++) dot[i * N + n] = dots[i];
        }
        if (!a->ln) {
            mix(rows, a->b, w ? r : NULL, D, E, O, a->DB, h + n * D, N * D);
            continue;
        }
        mix(rows, a->b, w ? r : NULL, D, E, O, a->DB, x, D);
        memcpy(first + n * D, x, (size_t)D * sizeof(float));
        for (int64_t o = 0; o < O; o++) {
            float m, rs;
            const float *xr = x + o * D;
            float *hr = h + (o * N + n) * D;
            layer_norm_stats(xr, D, a->ln_eps, &m, &rs);
            if (mean) {
                mean[o * N + n] = m;
                rstd[o * N + n] = rs;
            }
            for (int64_t c = 0; c < D; c++) {
                float v = (xr[c] - m) * rs;
                if (a->ln_w) v *= a->ln_w[c];
                if (a->ln_b) v += a->ln_b[c];
                hr[c] = v;
            }
        }
    }
    free(scratch);
    free(rows);
    return GRN_OK;
}

/* Forward. With the LayerNorm (ln = 1): first = x[0] (N, D) and h = LN(x) (O, N, D), with mean and rstd
 * (O, N) saved if given; without: x (O, N, D) into h, no first. rho (E, N) and dot (O, E, N) are saved if given
 * (GRN-v3). Returns GRN_OK, GRN_NO_MEMORY, or the code of the first bad dimension or buffer. */
int grn_forward(const int64_t *dims, float ln_eps, void *const *bufs, const int64_t *sizes, int64_t n_buffers) {
    if (n_buffers != FORWARD_BUFFERS) return GRN_BAD_BUFFER + FORWARD_BUFFERS;
    int err = check_dims(dims);
    const int64_t N = dims[DIM_N], D = dims[DIM_D], O = dims[DIM_O], DB = dims[DIM_DB];
    const int64_t E = dims[DIM_E0] + dims[DIM_E1] + dims[DIM_E2];
    const int ln = (int)dims[DIM_LN], has_w = bufs[F_W] != NULL;
    if (!err) err = check_chunks(bufs, sizes, F_C0, dims);
    if (!err) err = check_buffer(bufs, sizes, F_B, REQUIRED, prod(O, E, DB));
    if (!err) err = check_buffer(bufs, sizes, F_W, OPTIONAL, prod(O, D, 1));
    if (!err) err = check_buffer(bufs, sizes, F_LNW, ln ? OPTIONAL : ABSENT, D);
    if (!err) err = check_buffer(bufs, sizes, F_LNB, ln ? OPTIONAL : ABSENT, D);
    if (!err) err = check_buffer(bufs, sizes, F_FIRST, ln ? REQUIRED : ABSENT, prod(N, D, 1));
    if (!err) err = check_buffer(bufs, sizes, F_H, REQUIRED, prod(O, N, D));
    if (!err) err = check_pair(bufs, sizes, F_MEAN, ln ? OPTIONAL : ABSENT, prod(O, N, 1), prod(O, N, 1));
    if (!err) err = check_pair(bufs, sizes, F_RHO, has_w ? OPTIONAL : ABSENT, prod(E, N, 1), prod(O, E, N));
    if (err) return err;
    struct grn a = {N, D, O, DB, E, ln, ln_eps, NULL, NULL, bufs[F_B], bufs[F_W], bufs[F_LNW], bufs[F_LNB]};
    a.entries = entry_pointers((float *const *)bufs + F_C0, dims + DIM_E0, N, D);
    if (!a.entries) return GRN_NO_MEMORY;
    const int T = threads_for(N, E, D, dims[DIM_THREADS]);
    int status = GRN_OK;
#pragma omp parallel num_threads(T) if (T > 1) reduction(min : status)
    {
        int64_t t = thread_id(), nt = thread_count();
        status = forward_tokens(&a, bufs, N * t / nt, N * (t + 1) / nt);
    }
    free(a.entries);
    return status;
}

/* where one thread accumulates the parameters' gradients (the caller's buffers for thread 0) */
struct grads {
    float *b, *w, *ln_w, *ln_b;
};

static int backward_tokens(const struct grn *a, void *const *bufs, struct grads acc, int64_t n_begin,
                           int64_t n_end) {
    const int64_t N = a->N, D = a->D, O = a->O, DB = a->DB, E = a->E;
    const float *b = a->b, *w = a->w, *ln_w = a->ln_w;
    const float *grad = bufs[B_GRAD], *grad_first = bufs[B_GRAD_FIRST], *mean = bufs[B_MEAN];
    const float *rstd = bufs[B_RSTD], *rho = bufs[B_RHO], *dot = bufs[B_DOT];
    float *scratch = malloc(sizeof(float) * (size_t)(2 * O * D + 4 * O * E));
    const float **rows = malloc(sizeof(float *) * (size_t)E);
    if (!scratch || !rows) {
        free(scratch);
        free(rows);
        return GRN_NO_MEMORY;
    }
    float *x = scratch, *gx = scratch + O * D, *r = gx + O * D, *grad_r = r + O * E, *dt = grad_r + O * E;
    float *coef = dt + O * E;
    const float invD = 1.0f / (float)D;
    for (int64_t n = n_begin; n < n_end; n++) {
        for (int64_t j = 0; j < E; j++) rows[j] = a->entries[j] + n * D;
        if (w)
            for (int64_t o = 0; o < O; o++)
                for (int64_t j = 0; j < E; j++) {
                    float d = dot[(o * E + j) * N + n], s = rho[j * N + n] * d;
                    dt[o * E + j] = d;
                    r[o * E + j] = s < 0.0f ? 0.0f : s; /* NaN stays NaN, like clamp(min=0) */
                }
        /* the gradient of x, per output */
        if (a->ln) {
            mix(rows, b, w ? r : NULL, D, E, O, DB, x, D); /* recomputed, not saved */
            for (int64_t o = 0; o < O; o++) {
                const float *restrict gh = grad + (o * N + n) * D;
                float *restrict xhat = x + o * D; /* x is done with once normalised: xhat in its place */
                float *restrict gxo = gx + o * D;
                float m = mean[o * N + n], rs = rstd[o * N + n];
                for (int64_t c = 0; c < D; c++) {
                    xhat[c] = (xhat[c] - m) * rs;
                    gxo[c] = ln_w ? gh[c] * ln_w[c] : gh[c];
                }
                if (acc.ln_w)
                    for (int64_t c = 0; c < D; c++) acc.ln_w[c] += gh[c] * xhat[c];
                if (acc.ln_b)
                    for (int64_t c = 0; c < D; c++) acc.ln_b[c] += gh[c];
                float s1 = sumf(gxo, D) * invD, s2 = dotf(gxo, xhat, D) * invD;
                for (int64_t c = 0; c < D; c++) gxo[c] = rs * (gxo[c] - s1 - xhat[c] * s2);
            }
            if (grad_first) {
                const float *gf = grad_first + n * D;
                for (int64_t c = 0; c < D; c++) gx[c] += gf[c];
            }
        } else {
            for (int64_t o = 0; o < O; o++) memcpy(gx + o * D, grad + (o * N + n) * D, (size_t)D * sizeof(float));
        }
        /* per entry: grad_b, grad_r, and the entry's gradient through the mixture */
        for (int64_t j = 0; j < E; j++) {
            const float *restrict g = rows[j];
            float *restrict gg = a->grad_entries[j] + n * D;
            if (DB != 1) {
                if (O == 3)
                    entry_grads(g, gx, b, w ? r : NULL, acc.b, grad_r, gg, D, E, 3, j);
                else if (O == 1)
                    entry_grads(g, gx, b, w ? r : NULL, acc.b, grad_r, gg, D, E, 1, j);
                else
                    entry_grads(g, gx, b, w ? r : NULL, acc.b, grad_r, gg, D, E, O, j);
            } else { /* GRN-v1: one weight per entry and output */
                for (int64_t o = 0; o < O; o++) {
                    const float *restrict gxo = gx + o * D;
                    float p = dotf(gxo, g, D), cf = b[o * E + j] + (w ? r[o * E + j] : 0.0f);
                    acc.b[o * E + j] += p;
                    if (w) grad_r[o * E + j] = p;
                    if (o == 0) {
                        for (int64_t c = 0; c < D; c++) gg[c] = gxo[c] * cf;
                    } else {
                        for (int64_t c = 0; c < D; c++) gg[c] += gxo[c] * cf;
                    }
                }
            }
            if (w) {
                /* through the gate: s = rho * dot, r = max(s, 0) with derivative 1 at 0 (grn.py); as in grn.py
                 * the gradient is grad_r * (dot >= 0), so a NaN gradient stays NaN */
                float rh = rho[j * N + n], kappa = 0.0f;
                for (int64_t o = 0; o < O; o++) {
                    float d = dt[o * E + j], gs = grad_r[o * E + j] * (d >= 0.0f ? 1.0f : 0.0f);
                    coef[o] = gs * rh; /* d loss / d dot */
                    kappa += gs * d;
                }
                kappa *= rh * rh * rh * -invD; /* d rho / d g = -rho^3 g / D */
                /* grad_w[o] += coef[o] g and gg += sum_o coef[o] w[o] + kappa g, a vector at a time */
                int64_t c = 0;
                for (; c + W <= D; c += W) {
                    vf v = load(g + c), out = load(gg + c);
                    for (int64_t o = 0; o < O; o++) {
                        float *gwo = acc.w + o * D + c;
                        store(gwo, load(gwo) + coef[o] * v);
                        out += coef[o] * load(w + o * D + c);
                    }
                    store(gg + c, out + kappa * v);
                }
                for (; c < D; c++) {
                    float out = gg[c];
                    for (int64_t o = 0; o < O; o++) {
                        acc.w[o * D + c] += coef[o] * g[c];
                        out += coef[o] * w[o * D + c];
                    }
                    gg[c] = out + kappa * g[c];
                }
            }
        }
    }
    free(scratch);
    free(rows);
    return GRN_OK;
}

static void add_into(float *restrict to, const float *restrict from, int64_t n) {
    if (to)
        for (int64_t i = 0; i < n; i++) to[i] += from[i];
}

/* Backward of grn_forward for the gradient grad (O, N, D) of h (ln) or of x (no ln), plus grad_first (N, D,
 * if given) of first. Writes the chunks' gradients g0, g1, g2 (the chunks' shapes) and accumulates into
 * grad_b (O, E, DB), grad_w (O, D; with w), grad_ln_w and grad_ln_b (D; each if given), all zeroed by the
 * caller. Returns as grn_forward. Threads accumulate the parameters' gradients apart and add them up in
 * thread order: for a given thread count the result does not depend on the schedule. */
int grn_backward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t n_buffers) {
    if (n_buffers != BACKWARD_BUFFERS) return GRN_BAD_BUFFER + BACKWARD_BUFFERS;
    int err = check_dims(dims);
    const int64_t N = dims[DIM_N], D = dims[DIM_D], O = dims[DIM_O], DB = dims[DIM_DB];
    const int64_t E = dims[DIM_E0] + dims[DIM_E1] + dims[DIM_E2];
    const int ln = (int)dims[DIM_LN], has_w = bufs[B_W] != NULL;
    if (!err) err = check_chunks(bufs, sizes, B_C0, dims);
    if (!err) err = check_buffer(bufs, sizes, B_B, REQUIRED, prod(O, E, DB));
    if (!err) err = check_buffer(bufs, sizes, B_W, OPTIONAL, prod(O, D, 1));
    if (!err) err = check_buffer(bufs, sizes, B_LNW, ln ? OPTIONAL : ABSENT, D);
    if (!err) err = check_buffer(bufs, sizes, B_GRAD, REQUIRED, prod(O, N, D));
    if (!err) err = check_buffer(bufs, sizes, B_GRAD_FIRST, ln ? OPTIONAL : ABSENT, prod(N, D, 1));
    if (!err) err = check_pair(bufs, sizes, B_MEAN, ln ? REQUIRED : ABSENT, prod(O, N, 1), prod(O, N, 1));
    if (!err) err = check_pair(bufs, sizes, B_RHO, has_w ? REQUIRED : ABSENT, prod(E, N, 1), prod(O, E, N));
    if (!err) err = check_chunks(bufs, sizes, B_G0, dims);
    if (!err) err = check_buffer(bufs, sizes, B_GRAD_B, REQUIRED, prod(O, E, DB));
    if (!err) err = check_buffer(bufs, sizes, B_GRAD_W, has_w ? REQUIRED : ABSENT, prod(O, D, 1));
    if (!err) err = check_buffer(bufs, sizes, B_GRAD_LNW, ln ? OPTIONAL : ABSENT, D);
    if (!err) err = check_buffer(bufs, sizes, B_GRAD_LNB, ln ? OPTIONAL : ABSENT, D);
    if (err) return err;
    struct grn a = {N, D, O, DB, E, ln, 0.0f, NULL, NULL, bufs[B_B], bufs[B_W], bufs[B_LNW], NULL};
    a.entries = entry_pointers((float *const *)bufs + B_C0, dims + DIM_E0, N, D);
    a.grad_entries = entry_pointers((float *const *)bufs + B_G0, dims + DIM_E0, N, D);
    const int T = threads_for(N, E, D, dims[DIM_THREADS]);
    const int64_t per_thread = O * E * DB + O * D + 2 * D; /* grad_b, grad_w, grad_ln_w, grad_ln_b */
    float *extra = T > 1 ? calloc((size_t)((T - 1) * per_thread), sizeof(float)) : NULL;
    int status = GRN_OK;
    if (!a.entries || !a.grad_entries || (T > 1 && !extra)) status = GRN_NO_MEMORY;
    if (!status) {
#pragma omp parallel num_threads(T) if (T > 1) reduction(min : status)
        {
            int64_t t = thread_id(), nt = thread_count();
            struct grads acc = {bufs[B_GRAD_B], bufs[B_GRAD_W], bufs[B_GRAD_LNW], bufs[B_GRAD_LNB]};
            if (t > 0) {
                float *mine = extra + (t - 1) * per_thread;
                acc = (struct grads){mine, has_w ? mine + O * E * DB : NULL, acc.ln_w ? mine + O * E * DB + O * D : NULL,
                                     acc.ln_b ? mine + O * E * DB + O * D + D : NULL};
            }
            status = backward_tokens(&a, bufs, acc, N * t / nt, N * (t + 1) / nt);
        }
        for (int64_t t = 1; t < T && !status; t++) {
            const float *mine = extra + (t - 1) * per_thread;
            add_into(bufs[B_GRAD_B], mine, O * E * DB);
            add_into(bufs[B_GRAD_W], mine + O * E * DB, O * D);
            add_into(bufs[B_GRAD_LNW], mine + O * E * DB + O * D, D);
            add_into(bufs[B_GRAD_LNB], mine + O * E * DB + O * D + D, D);
        }
    }
    free(extra);
    free(a.entries);
    free(a.grad_entries);
    return status;
}

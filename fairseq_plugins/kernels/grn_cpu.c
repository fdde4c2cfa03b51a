/* Fused float32 CPU kernels of the GRN mixing (fairseq_plugins/modules/grn.py has the equations).
 *
 * The pure-PyTorch GRN makes one pass over the tokens for every entry and every elementwise step (gate norm,
 * b + r, products, sums, LayerNorm), each op writing a full-size temporary: memory-bound glue around the
 * matmuls. These kernels walk the tokens once. For one token they read its E entries (E x D floats, in L1),
 * compute the gates, the O mixtures and their LayerNorm, and write the results; backward likewise. Plain C
 * (no torch headers, so it builds in about a second), called through ctypes by kernels/grn_kernel.py, which
 * owns every allocation. Single-threaded: the caller runs it with the tensors torch would have used.
 *
 * Layout: the stack comes as up to three chunks (grn.py's list of chunks: the whole stack, or k-DCA's embedding,
 * middle sum and last k), chunk c holding e_c entries of N x D floats one after the other (row-major, each
 * entry's token rows contiguous), E = e_0 + e_1 + e_2 entries in all; b is (O, E, DB)
 * with DB = D (GRN-v2/v3) or 1 (GRN-v1); w is (O, D) or NULL (GRN-v1/v2); the LayerNorm's weight and bias
 * are (D) or NULL. Saved per token: rho (E, N) and dot (O, E, N) (GRN-v3), mean and rstd (O, N) (LayerNorm).
 * O <= MAX_OUTPUTS (DCA's GRNs have 1 or 3; the caller runs the PyTorch code for more).
 */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define RMS_EPS 1e-6f
#define MAX_OUTPUTS 4

/* The hot loops are written with GCC/Clang vector extensions: vectors of 8 floats (one AVX register, two SSE
 * or NEON registers; the compiler lowers them to what the target has) and explicit independent accumulator
 * chains. Left to the auto-vectoriser, the blocked loops below came out as scalar code that shuffled their
 * operands into vectors, several times slower. Columns past the last whole vector run a scalar tail. */
#define W 8
typedef float vf __attribute__((vector_size(W * sizeof(float)), aligned(sizeof(float)), may_alias));

static inline vf load(const float *p) { return *(const vf *)p; }
static inline void store(float *p, vf v) { *(vf *)p = v; }
static inline vf splat(float x) { return (vf){0} + x; }
static inline float hsum(vf v) { return ((v[0] + v[4]) + (v[2] + v[6])) + ((v[1] + v[5]) + (v[3] + v[7])); }

/* a . b with four accumulator chains (one chain is bound by the add latency) */
static inline float dotf(const float *restrict a, const float *restrict b, int64_t n) {
    vf s0 = {0}, s1 = {0}, s2 = {0}, s3 = {0};
    int64_t c = 0;
    for (; c + 4 * W <= n; c += 4 * W) {
        s0 += load(a + c) * load(b + c);
        s1 += load(a + c + W) * load(b + c + W);
        s2 += load(a + c + 2 * W) * load(b + c + 2 * W);
        s3 += load(a + c + 3 * W) * load(b + c + 3 * W);
    }
    for (; c + W <= n; c += W) s0 += load(a + c) * load(b + c);
    float t = hsum((s0 + s1) + (s2 + s3));
    for (; c < n; c++) t += a[c] * b[c];
    return t;
}

/* sum (a - m)^2; with m = 0, sum a^2 */
static inline float sqdevf(const float *restrict a, float m, int64_t n) {
    vf s0 = {0}, s1 = {0}, mv = splat(m);
    int64_t c = 0;
    for (; c + 2 * W <= n; c += 2 * W) {
        vf d0 = load(a + c) - mv, d1 = load(a + c + W) - mv;
        s0 += d0 * d0;
        s1 += d1 * d1;
    }
    for (; c + W <= n; c += W) {
        vf d0 = load(a + c) - mv;
        s0 += d0 * d0;
    }
    float t = hsum(s0 + s1);
    for (; c < n; c++) t += (a[c] - m) * (a[c] - m);
    return t;
}

static inline float sumf(const float *restrict a, int64_t n) {
    vf s0 = {0}, s1 = {0};
    int64_t c = 0;
    for (; c + 2 * W <= n; c += 2 * W) {
        s0 += load(a + c);
        s1 += load(a + c + W);
    }
    for (; c + W <= n; c += W) s0 += load(a + c);
    float t = hsum(s0 + s1);
    for (; c < n; c++) t += a[c];
    return t;
}

/* ss = g . g and dots[o] = w_o . g in one pass over g; called with O a constant (DCA's 3, the GRN-vX modes' 1)
 * it is unrolled so that the O + 1 chains stay in registers. */
static inline __attribute__((always_inline)) void gate_sums(const float *restrict g, const float *restrict w,
                                                            int64_t D, const int64_t O, float *ss, float *dots) {
    vf acc_ss = {0}, acc[MAX_OUTPUTS] = {{0}};
    int64_t c = 0;
    for (; c + W <= D; c += W) {
        vf v = load(g + c);
        acc_ss += v * v;
        for (int64_t o = 0; o < O; o++) acc[o] += load(w + o * D + c) * v;
    }
    float t = hsum(acc_ss);
    for (int64_t k = c; k < D; k++) t += g[k] * g[k];
    *ss = t;
    for (int64_t o = 0; o < O; o++) {
        t = hsum(acc[o]);
        for (int64_t k = c; k < D; k++) t += w[o * D + k] * g[k];
        dots[o] = t;
    }
}

/* For entry j of one token (GRN-v2/v3, DB = D): grad_b[o, j] += gx_o * g, grad_r[o, j] = gx_o . g and
 * gg = sum_o gx_o * (b[o, j] + r[o, j]), in one pass over the row (unrolled when O is a constant). */
static inline __attribute__((always_inline)) void entry_grads(const float *restrict g, const float *restrict gx,
                                                              const float *restrict b, const float *r,
                                                              float *restrict grad_b, float *grad_r,
                                                              float *restrict gg, int64_t D, int64_t E,
                                                              const int64_t O, int64_t j) {
    vf acc[MAX_OUTPUTS] = {{0}};
    float rj[MAX_OUTPUTS];
    for (int64_t o = 0; o < O; o++) rj[o] = r ? r[o * E + j] : 0.0f;
    int64_t c = 0;
    for (; c + W <= D; c += W) {
        vf v = load(g + c), out = {0};
        for (int64_t o = 0; o < O; o++) {
            vf gxo = load(gx + o * D + c), q = gxo * v;
            float *gbj = grad_b + (o * E + j) * D + c;
            store(gbj, load(gbj) + q);
            acc[o] += q;
            out += gxo * (load(b + (o * E + j) * D + c) + rj[o]);
        }
        store(gg + c, out);
    }
    float tail_r[MAX_OUTPUTS] = {0};
    for (int64_t k = c; k < D; k++) {
        float out = 0.0f;
        for (int64_t o = 0; o < O; o++) {
            float q = gx[o * D + k] * g[k];
            grad_b[(o * E + j) * D + k] += q;
            tail_r[o] += q;
            out += gx[o * D + k] * (b[(o * E + j) * D + k] + rj[o]);
        }
        gg[k] = out;
    }
    for (int64_t o = 0; o < O; o++) grad_r[o * E + j] = hsum(acc[o]) + tail_r[o];
}

/* The gate of entry row g (entry j of E): rho = 1 / rms(g) and, per output o, dot = w_o . g and
 * r[o, j] = max(rho * dot, 0). Returns rho; dot_out and r are (O, E) with stride E. */
static float gate(const float *restrict g, const float *restrict w, int64_t D, int64_t O, int64_t E, int64_t j,
                  float *dot_out, float *r) {
    float ss, dots[MAX_OUTPUTS];
    if (O == 3)
        gate_sums(g, w, D, 3, &ss, dots);
    else if (O == 1)
        gate_sums(g, w, D, 1, &ss, dots);
    else
        gate_sums(g, w, D, O, &ss, dots);
    float rho = 1.0f / sqrtf(ss / (float)D + RMS_EPS);
    for (int64_t o = 0; o < O; o++) {
        float s = rho * dots[o];
        dot_out[o * E + j] = dots[o];
        r[o * E + j] = s > 0.0f ? s : 0.0f;
    }
    return rho;
}

/* x[o] = sum_j g_j * (b[o, j] + r[o, j]) for one token, output o at x + o * stride; r is (O, E) or NULL.
 * Four vectors of columns are summed over the entries in registers and stored once (entry by entry, every
 * entry would load and store the whole output row again); the sum runs in entry order, as in grn.py. */
static void mix(const float *const *rows, const float *restrict b, const float *r, int64_t D, int64_t E,
                int64_t O, int64_t DB, float *x, int64_t stride) {
    for (int64_t o = 0; o < O; o++) {
        float *restrict xo = x + o * stride;
        const float *bo = b + o * E * DB;
        int64_t c = 0;
        for (; c + 4 * W <= D; c += 4 * W) { /* four independent accumulator chains */
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t j = 0; j < E; j++) {
                const float *g = rows[j] + c;
                float rj = r ? r[o * E + j] : 0.0f;
                if (DB == 1) {
                    float coef = bo[j] + rj;
                    a0 += load(g) * coef;
                    a1 += load(g + W) * coef;
                    a2 += load(g + 2 * W) * coef;
                    a3 += load(g + 3 * W) * coef;
                } else {
                    const float *bj = bo + j * DB + c;
                    a0 += load(g) * (load(bj) + rj);
                    a1 += load(g + W) * (load(bj + W) + rj);
                    a2 += load(g + 2 * W) * (load(bj + 2 * W) + rj);
                    a3 += load(g + 3 * W) * (load(bj + 3 * W) + rj);
                }
            }
            store(xo + c, a0);
            store(xo + c + W, a1);
            store(xo + c + 2 * W, a2);
            store(xo + c + 3 * W, a3);
        }
        for (; c < D; c++) { /* the columns past the last whole block */
            float acc = 0.0f;
            for (int64_t j = 0; j < E; j++)
                acc += rows[j][c] * ((DB == 1 ? bo[j] : bo[j * DB + c]) + (r ? r[o * E + j] : 0.0f));
            xo[c] = acc;
        }
    }
}

static void layer_norm_stats(const float *restrict x, int64_t D, float eps, float *mean, float *rstd) {
    float m = sumf(x, D) / (float)D;
    *mean = m;
    *rstd = 1.0f / sqrtf(sqdevf(x, m, D) / (float)D + eps);
}

/* Pointers to the E entries of up to three chunks (see the layout above); NULL if out of memory. */
static const float **entry_pointers(const float *c0, int64_t e0, const float *c1, int64_t e1, const float *c2,
                                    int64_t e2, int64_t N, int64_t D) {
    const float **p = malloc(sizeof(float *) * (size_t)(e0 + e1 + e2 + 1));
    if (!p) return NULL;
    int64_t j = 0;
    for (int64_t i = 0; i < e0; i++) p[j++] = c0 + i * N * D;
    for (int64_t i = 0; i < e1; i++) p[j++] = c1 + i * N * D;
    for (int64_t i = 0; i < e2; i++) p[j++] = c2 + i * N * D;
    return p;
}

/* Forward. With the LayerNorm (ln != 0): first = x[0] (N, D) and h = LN(x) (O, N, D), with mean and rstd
 * (O, N) saved unless NULL; without: x (O, N, D) into h, first unused. rho (E, N) and dot (O, E, N) are
 * saved unless NULL. Returns 0, or -1 if its working memory could not be allocated. */
int grn_forward(int64_t N, int64_t D, int64_t O, int64_t DB, const float *c0, int64_t e0, const float *c1,
                int64_t e1, const float *c2, int64_t e2, const float *b, const float *w, int ln, const float *ln_w,
                const float *ln_b, float ln_eps, float *first, float *h, float *mean, float *rstd, float *rho,
                float *dot) {
    const int64_t E = e0 + e1 + e2;
    float *scratch = malloc(sizeof(float) * (size_t)(O * D + 2 * O * E));
    const float **rows = malloc(sizeof(float *) * (size_t)E);
    const float **entries = entry_pointers(c0, e0, c1, e1, c2, e2, N, D);
    if (!scratch || !rows || !entries) {
        free(scratch);
        free(rows);
        free(entries);
        return -1;
    }
    float *x = scratch, *r = scratch + O * D, *dots = r + O * E;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < E; j++) rows[j] = entries[j] + n * D;
        if (w) {
            for (int64_t j = 0; j < E; j++) {
                float rh = gate(rows[j], w, D, O, E, j, dots, r);
                if (rho) rho[j * N + n] = rh;
            }
            if (dot)
                for (int64_t i = 0; i < O * E; i++) dot[i * N + n] = dots[i];
        }
        if (!ln) {
            mix(rows, b, w ? r : NULL, D, E, O, DB, h + n * D, N * D);
            continue;
        }
        mix(rows, b, w ? r : NULL, D, E, O, DB, x, D);
        memcpy(first + n * D, x, (size_t)D * sizeof(float));
        for (int64_t o = 0; o < O; o++) {
            float m, rs;
            const float *xr = x + o * D;
            float *hr = h + (o * N + n) * D;
            layer_norm_stats(xr, D, ln_eps, &m, &rs);
            if (mean) {
                mean[o * N + n] = m;
                rstd[o * N + n] = rs;
            }
            for (int64_t c = 0; c < D; c++) {
                float v = (xr[c] - m) * rs;
                if (ln_w) v *= ln_w[c];
                if (ln_b) v += ln_b[c];
                hr[c] = v;
            }
        }
    }
    free(scratch);
    free(rows);
    free(entries);
    return 0;
}

/* Backward of grn_forward for the gradient grad (O, N, D) of h (ln) or of x (no ln), plus grad_first
 * (N, D, or NULL) of first. Writes grad_entries[j] (N, D) and accumulates into grad_b (O, E, DB), grad_w
 * (O, D; NULL without w), grad_ln_w and grad_ln_b (D; NULL without the LayerNorm or its affine part), all
 * zeroed by the caller. Returns 0, or -1 if its working memory could not be allocated. */
int grn_backward(int64_t N, int64_t D, int64_t O, int64_t DB, const float *c0, int64_t e0, const float *c1,
                 int64_t e1, const float *c2, int64_t e2, const float *b, const float *w, int ln, const float *ln_w,
                 const float *grad, const float *grad_first, const float *mean, const float *rstd,
                 const float *rho, const float *dot, float *g0, float *g1, float *g2, float *grad_b,
                 float *grad_w, float *grad_ln_w, float *grad_ln_b) {
    const int64_t E = e0 + e1 + e2;
    float *scratch = malloc(sizeof(float) * (size_t)(2 * O * D + 4 * O * E));
    const float **rows = malloc(sizeof(float *) * (size_t)E);
    const float **entries = entry_pointers(c0, e0, c1, e1, c2, e2, N, D);
    float **grad_entries = (float **)entry_pointers(g0, e0, g1, e1, g2, e2, N, D);
    if (!scratch || !rows || !entries || !grad_entries) {
        free(scratch);
        free(rows);
        free(entries);
        free(grad_entries);
        return -1;
    }
    float *x = scratch, *gx = scratch + O * D, *r = gx + O * D, *grad_r = r + O * E, *dt = grad_r + O * E;
    float *coef = dt + O * E;
    const float invD = 1.0f / (float)D;
    for (int64_t n = 0; n < N; n++) {
        for (int64_t j = 0; j < E; j++) rows[j] = entries[j] + n * D;
        if (w)
            for (int64_t o = 0; o < O; o++)
                for (int64_t j = 0; j < E; j++) {
                    float d = dot[(o * E + j) * N + n], s = rho[j * N + n] * d;
                    dt[o * E + j] = d;
                    r[o * E + j] = s > 0.0f ? s : 0.0f;
                }
        /* the gradient of x, per output */
        if (ln) {
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
                if (grad_ln_w)
                    for (int64_t c = 0; c < D; c++) grad_ln_w[c] += gh[c] * xhat[c];
                if (grad_ln_b)
                    for (int64_t c = 0; c < D; c++) grad_ln_b[c] += gh[c];
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
            float *restrict gg = grad_entries[j] + n * D;
            if (DB != 1) {
                if (O == 3)
                    entry_grads(g, gx, b, w ? r : NULL, grad_b, grad_r, gg, D, E, 3, j);
                else if (O == 1)
                    entry_grads(g, gx, b, w ? r : NULL, grad_b, grad_r, gg, D, E, 1, j);
                else
                    entry_grads(g, gx, b, w ? r : NULL, grad_b, grad_r, gg, D, E, O, j);
            } else { /* GRN-v1: one weight per entry and output */
                for (int64_t o = 0; o < O; o++) {
                    const float *restrict gxo = gx + o * D;
                    float p = dotf(gxo, g, D), cf = b[o * E + j] + (w ? r[o * E + j] : 0.0f);
                    grad_b[o * E + j] += p;
                    if (w) grad_r[o * E + j] = p;
                    if (o == 0) {
                        for (int64_t c = 0; c < D; c++) gg[c] = gxo[c] * cf;
                    } else {
                        for (int64_t c = 0; c < D; c++) gg[c] += gxo[c] * cf;
                    }
                }
            }
            if (w) {
                /* through the gate: s = rho * dot, r = max(s, 0) with derivative 1 at 0 (grn.py) */
                float rh = rho[j * N + n], kappa = 0.0f;
                for (int64_t o = 0; o < O; o++) {
                    float d = dt[o * E + j], gs = d >= 0.0f ? grad_r[o * E + j] : 0.0f;
                    coef[o] = gs * rh; /* d loss / d dot */
                    kappa += gs * d;
                }
                kappa *= rh * rh * rh * -invD; /* d rho / d g = -rho^3 g / D */
                /* grad_w[o] += coef[o] g and gg += sum_o coef[o] w[o] + kappa g, a vector at a time */
                int64_t c = 0;
                for (; c + W <= D; c += W) {
                    vf v = load(g + c), out = load(gg + c);
                    for (int64_t o = 0; o < O; o++) {
                        float *gwo = grad_w + o * D + c;
                        store(gwo, load(gwo) + coef[o] * v);
                        out += coef[o] * load(w + o * D + c);
                    }
                    store(gg + c, out + kappa * v);
                }
                for (; c < D; c++) {
                    float out = gg[c];
                    for (int64_t o = 0; o < O; o++) {
                        grad_w[o * D + c] += coef[o] * g[c];
                        out += coef[o] * w[o * D + c];
                    }
                    gg[c] = out + kappa * g[c];
                }
            }
        }
    }
    free(scratch);
    free(rows);
    free(entries);
    free(grad_entries);
    return 0;
}

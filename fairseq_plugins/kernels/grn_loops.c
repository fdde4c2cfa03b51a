/* The per-token loops of the GRN kernels, included by grn_cpu.c (one translation unit, so that they inline
 * into its entry points; grn_cpu.c describes the layout). */

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
        r[o * E + j] = s < 0.0f ? 0.0f : s; /* NaN stays NaN, like clamp(min=0) in grn.py */
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


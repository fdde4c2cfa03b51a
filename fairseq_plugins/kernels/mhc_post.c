/* The depth connection of hyper-connections and mHC, included by mhc_cpu.c (after mhc_mix.c, whose checks and
 * helpers it uses).
 *
 * Per token t, new = mixed + H_post^T F: new[t, i] = mixed[t, i] + post[i, t] out[t] (n x C), and backward
 * grad_out[t] = sum_i post[i, t] grad[t, i], grad_post[i, t] = sum_c grad[t, i, c] out[t, c] (grad_mixed is
 * grad itself). In PyTorch the backward was two bmm of one (n, C) x (C, 1) and one (1, n) x (n, C) product per
 * token (their time is the per-matrix overhead) and a transposing copy of the tokens-last H_post; here one
 * pass over the token's n x C gradient, which stays in L1.
 *
 * Layout: mixed, new and grad (T, n, C) token-major, out and grad_out (T, C), post and grad_post (n, T)
 * tokens last, as the coefficient kernels write them.
 */

static void post_tokens(const float *restrict mixed, const float *restrict post, const float *restrict out,
                        float *restrict next, int64_t T, int n, int64_t C, int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; t++) {
        const float *ot = out + t * C;
        for (int i = 0; i < n; i++) {
            const float *m = mixed + (t * n + i) * C;
            float *dst = next + (t * n + i) * C, p = post[i * T + t];
            for (int64_t c = 0; c < C; c++) dst[c] = m[c] + p * ot[c];
        }
    }
}

/* grad_out and the n dot products with out in one pass over C (independent chains, summed as dot() sums) */
static void post_backward_tokens(const float *restrict grad, const float *restrict post, const float *restrict out,
                                 float *restrict grad_post, float *restrict grad_out, int64_t T, int n, int64_t C,
                                 int64_t t0, int64_t t1) {
    float p[MAX_N];
    for (int64_t t = t0; t < t1; t++) {
        const float *ot = out + t * C, *gt = grad + t * n * C;
        float *go = grad_out + t * C;
        vec acc[MAX_N];
        for (int i = 0; i < n; i++) p[i] = post[i * T + t], acc[i] = (vec){0};
        int64_t c = 0;
        for (; c + LANES <= C; c += LANES) {
            vec ov = load(ot + c, LANES, 0.0f), g0 = load(gt + c, LANES, 0.0f), sum = p[0] * g0;
            acc[0] += g0 * ov;
            for (int i = 1; i < n; i++) {
                vec gi = load(gt + i * C + c, LANES, 0.0f);
                sum += p[i] * gi;
                acc[i] += gi * ov;
            }
            store(go + c, sum, LANES);
        }
        for (int64_t r = c; r < C; r++) {
            float sum = p[0] * gt[r];
            for (int i = 1; i < n; i++) sum += p[i] * gt[i * C + r];
            go[r] = sum;
        }
        for (int i = 0; i < n; i++) grad_post[i * T + t] = finish(acc[i], gt + i * C, ot, c, C);
    }
}

enum { PF_MIXED, PF_POST, PF_OUT, PF_NEW, POST_FORWARD_BUFFERS };
enum { PB_GRAD, PB_POST, PB_OUT, PB_GRAD_POST, PB_GRAD_OUT, POST_BACKWARD_BUFFERS };

/* new (T, n, C) = mixed (T, n, C) + post (n, T) x out (T, C), per token. dims: n, tokens, C, threads. */
int mhc_post_forward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_mix(dims, bufs, sizes, count, "spus");
    if (err) return err;
    int n = (int)dims[MIX_N], threads = mix_threads(dims);
    int64_t T = dims[MIX_TOKENS], C = dims[MIX_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        post_tokens(bufs[PF_MIXED], bufs[PF_POST], bufs[PF_OUT], bufs[PF_NEW], T, n, C, T * id / all,
                    T * (id + 1) / all);
    }
    return MHC_OK;
}

/* grad_post (n, T) and grad_out (T, C) from grad (T, n, C) of new. */
int mhc_post_backward(const int64_t *dims, void *const *bufs, const int64_t *sizes, int64_t count) {
    int err = check_mix(dims, bufs, sizes, count, "spupu");
    if (err) return err;
    int n = (int)dims[MIX_N], threads = mix_threads(dims);
    int64_t T = dims[MIX_TOKENS], C = dims[MIX_WIDTH];
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int id = THREAD_ID, all = THREAD_COUNT;
        post_backward_tokens(bufs[PB_GRAD], bufs[PB_POST], bufs[PB_OUT], bufs[PB_GRAD_POST], bufs[PB_GRAD_OUT], T,
                             n, C, T * id / all, T * (id + 1) / all);
    }
    return MHC_OK;
}

/* Drives the GRN kernels (fairseq_plugins/kernels/grn_cpu.c, included below) under AddressSanitizer and
 * UndefinedBehaviorSanitizer: a sweep of well-formed shapes through forward and backward (every buffer
 * allocated to its exact size, so one float too far is a report), then malformed calls (a buffer one float
 * short, bad dimensions, missing or extra buffers, sizes that overflow), each of which must return an error
 * code without touching memory. tests/test_kernel_sanitizers.py builds and runs it.
 * Prints "ok <calls>" and exits 0, or names the first failing call and exits 1. */
#include "grn_cpu.c"

#include <stdio.h>

static float *filled(int64_t n, unsigned *seed) {
    if (n <= 0) return NULL;
    float *p = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        *seed = *seed * 1103515245u + 12345u;
        p[i] = (float)((*seed >> 8) & 0xffff) / 32768.0f - 1.0f;
    }
    return p;
}

static long calls;

static int expect(int got, int ok, const char *what, const int64_t *dims) {
    calls++;
    if ((got == GRN_OK) == ok) return 0;
    fprintf(stderr, "%s: status %d (N=%lld D=%lld O=%lld DB=%lld e=%lld,%lld,%lld ln=%lld threads=%lld)\n", what,
            got, (long long)dims[0], (long long)dims[1], (long long)dims[2], (long long)dims[3], (long long)dims[4],
            (long long)dims[5], (long long)dims[6], (long long)dims[7], (long long)dims[8]);
    return 1;
}

/* One forward and backward on buffers of the exact sizes; `shorten`: a buffer index made one float short
 * (forward's index, or FORWARD_BUFFERS + backward's), which must be refused; -1 for none. */
static int run(int64_t N, int64_t D, int64_t O, int64_t DB, const int64_t e[3], int ln, int gate, int threads,
               int shorten, unsigned *seed) {
    const int64_t E = e[0] + e[1] + e[2];
    int64_t dims[DIMS] = {N, D, O, DB, e[0], e[1], e[2], ln, threads};
    int64_t fsz[FORWARD_BUFFERS] = {0}, bsz[BACKWARD_BUFFERS] = {0};
    for (int c = 0; c < 3; c++) fsz[F_C0 + c] = bsz[B_C0 + c] = bsz[B_G0 + c] = e[c] * N * D;
    fsz[F_B] = bsz[B_B] = bsz[B_GRAD_B] = O * E * DB;
    fsz[F_W] = bsz[B_W] = bsz[B_GRAD_W] = gate ? O * D : 0;
    fsz[F_LNW] = fsz[F_LNB] = bsz[B_LNW] = bsz[B_GRAD_LNW] = bsz[B_GRAD_LNB] = ln ? D : 0;
    fsz[F_FIRST] = bsz[B_GRAD_FIRST] = ln ? N * D : 0;
    fsz[F_H] = bsz[B_GRAD] = O * N * D;
    fsz[F_MEAN] = fsz[F_RSTD] = bsz[B_MEAN] = bsz[B_RSTD] = ln ? O * N : 0;
    fsz[F_RHO] = bsz[B_RHO] = gate ? E * N : 0;
    fsz[F_DOT] = bsz[B_DOT] = gate ? O * E * N : 0;
    if (shorten >= 0 && shorten < FORWARD_BUFFERS && fsz[shorten]) fsz[shorten]--;
    else if (shorten >= FORWARD_BUFFERS && bsz[shorten - FORWARD_BUFFERS]) bsz[shorten - FORWARD_BUFFERS]--;
    else if (shorten >= 0) return 0; /* an absent buffer: nothing to shorten */
    void *fb[FORWARD_BUFFERS], *bb[BACKWARD_BUFFERS];
    for (int k = 0; k < FORWARD_BUFFERS; k++) fb[k] = filled(fsz[k], seed);
    for (int k = 0; k < BACKWARD_BUFFERS; k++) bb[k] = filled(bsz[k], seed);
    int fail = expect(grn_forward(dims, 1e-5f, fb, fsz, FORWARD_BUFFERS), shorten < 0 || shorten >= FORWARD_BUFFERS,
                      "forward", dims);  /* forward must refuse exactly its own short buffers */
    /* backward reads what forward saved: the same inputs and statistics */
    const int shared[][2] = {{B_C0, F_C0}, {B_C1, F_C1}, {B_C2, F_C2}, {B_B, F_B},       {B_W, F_W},
                             {B_LNW, F_LNW}, {B_MEAN, F_MEAN}, {B_RSTD, F_RSTD}, {B_RHO, F_RHO}, {B_DOT, F_DOT}};
    for (size_t i = 0; i < sizeof shared / sizeof shared[0]; i++)
        if (bb[shared[i][0]] && fb[shared[i][1]] && bsz[shared[i][0]] == fsz[shared[i][1]])
            memcpy(bb[shared[i][0]], fb[shared[i][1]], sizeof(float) * (size_t)bsz[shared[i][0]]);
    fail |= expect(grn_backward(dims, bb, bsz, BACKWARD_BUFFERS), shorten < FORWARD_BUFFERS, "backward", dims);
    for (int k = 0; k < FORWARD_BUFFERS; k++) free(fb[k]);
    for (int k = 0; k < BACKWARD_BUFFERS; k++) free(bb[k]);
    return fail;
}

int main(void) {
    unsigned seed = 1;
    int fail = 0;
    const int64_t splits[][3] = {{1, 0, 0}, {3, 0, 0}, {1, 1, 2}, {2, 3, 0}, {0, 2, 0}};
    const int64_t widths[] = {1, 3, 7, 8, 9, 16, 17, 33, 40};
    /* well-formed: every width class of the vector loops, output count, layout, gate and LayerNorm; tokens
     * enough for two threads to split them at the largest width */
    for (size_t s = 0; s < sizeof splits / sizeof splits[0]; s++)
        for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
            for (int64_t O = 1; O <= MAX_OUTPUTS; O++)
                for (int v = 0; v < 4; v++) {
                    int64_t D = widths[wi], N = D == 40 ? 2000 : 3;
                    fail |= run(N, D, O, v & 1 ? D : 1, splits[s], v >> 1, v & 1, D == 40 ? 2 : 1, -1, &seed);
                }
    /* one buffer one float short, for every buffer: refused, nothing read or written past it */
    for (int k = 0; k < FORWARD_BUFFERS + BACKWARD_BUFFERS; k++)
        for (int v = 0; v < 4; v++) fail |= run(4, 9, 3, 9, splits[2], v >> 1, v & 1, 1, k, &seed);
    /* bad dimensions and buffer tables */
    const int64_t bad[][DIMS] = {
        {0, 8, 1, 8, 1, 0, 0, 0, 1},  {-4, 8, 1, 8, 1, 0, 0, 0, 1}, {4, 0, 1, 1, 1, 0, 0, 0, 1},
        {4, 8, 0, 8, 1, 0, 0, 1, 1},  {4, 8, 5, 8, 1, 0, 0, 0, 1},  {4, 8, 1, 3, 1, 0, 0, 0, 1},
        {4, 8, 1, 8, 0, 0, 0, 0, 1},  {4, 8, 1, 8, -1, 2, 0, 0, 1}, {4, 8, 1, 8, 1, 0, 0, 2, 1},
        {4, 8, 1, 8, 1, 0, 0, 0, 0},  {INT64_MAX / 2, INT64_MAX / 2, 1, 1, 1, 0, 0, 0, 1},
        {(int64_t)1 << 40, (int64_t)1 << 30, 1, 1, 1, 0, 0, 0, 1},
    };
    float one[64] = {0};
    void *fb[FORWARD_BUFFERS] = {0}, *bb[BACKWARD_BUFFERS] = {0};
    int64_t fsz[FORWARD_BUFFERS] = {0}, bsz[BACKWARD_BUFFERS] = {0};
    for (int k = 0; k < FORWARD_BUFFERS; k++) fb[k] = one, fsz[k] = 1;
    for (int k = 0; k < BACKWARD_BUFFERS; k++) bb[k] = one, bsz[k] = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fail |= expect(grn_forward(bad[i], 1e-5f, fb, fsz, FORWARD_BUFFERS), 0, "bad forward", bad[i]);
        fail |= expect(grn_backward(bad[i], bb, bsz, BACKWARD_BUFFERS), 0, "bad backward", bad[i]);
    }
    const int64_t good[DIMS] = {1, 1, 1, 1, 1, 0, 0, 0, 1};
    fail |= expect(grn_forward(good, 1e-5f, fb, fsz, FORWARD_BUFFERS - 1), 0, "short table", good);
    fail |= expect(grn_backward(good, bb, bsz, BACKWARD_BUFFERS + 1), 0, "long table", good);
    fail |= expect(grn_forward(good, 1e-5f, fb, fsz, FORWARD_BUFFERS), 0, "extra buffers", good);
    if (fail) return 1;
    printf("ok %ld\n", calls);
    return 0;
}

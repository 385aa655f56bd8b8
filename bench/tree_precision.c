/* What the reference's float64 trees cost against float32 ones (cpprb's) on an
 * update_priority: 4096 random leaves of a 2^20-leaf sum tree and min tree, each
 * leaf written, then its ancestors up to the root recomputed (cpprb's algorithm,
 * the same for both widths), 32 MiB written between updates, the two widths
 * alternating which goes first, medians of 300 (the third peers run of 2026-11-27, in the git history of docs/benchmarks.md).
 *
 *     cc -O3 bench/tree_precision.c -o tree_precision && ./tree_precision */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#define LEAVES (1 << 20)
#define N 4096
#define REPS 300
#define DEFINE(T, NAME) \
static void NAME(T *s, T *m, const long *idx, const T *v) { \
    for (int i = 0; i < N; i++) { \
        long k = LEAVES + idx[i]; s[k] = v[i]; m[k] = v[i]; \
        for (k >>= 1; k >= 1; k >>= 1) { \
            s[k] = s[2 * k] + s[2 * k + 1]; \
            m[k] = m[2 * k] < m[2 * k + 1] ? m[2 * k] : m[2 * k + 1]; } } }
DEFINE(float, upd32)
DEFINE(double, upd64)
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static int cmp(const void *a, const void *b) { double x = *(double *)a, y = *(double *)b; return (x > y) - (x < y); }
int main(void) {
    float *s32 = calloc(2 * LEAVES, 4), *m32 = calloc(2 * LEAVES, 4), v32[N];
    double *s64 = calloc(2 * LEAVES, 8), *m64 = calloc(2 * LEAVES, 8), v64[N];
    char *junk = malloc(32 << 20);
    for (long i = 0; i < 2 * LEAVES; i++) { s32[i] = m32[i] = 1; s64[i] = m64[i] = 1; }
    long idx[N]; double t32[REPS], t64[REPS];
    srand(1);
    for (int r = 0; r < REPS; r++) {
        for (int i = 0; i < N; i++) { idx[i] = ((long)rand() << 8 ^ rand()) % LEAVES; v32[i] = v64[i] = rand() / (double)RAND_MAX; }
        for (int pass = 0; pass < 2; pass++) {
            int f = (r + pass) % 2;  /* alternate which goes first */
            memset(junk, r + pass, 32 << 20);
            double t0 = now();
            if (f) upd32(s32, m32, idx, v32); else upd64(s64, m64, idx, v64);
            (f ? t32 : t64)[r] = now() - t0;
        }
    }
    qsort(t32, REPS, 8, cmp); qsort(t64, REPS, 8, cmp);
    printf("float32 trees: median %.1f us, min %.1f\nfloat64 trees: median %.1f us, min %.1f\nratio %.2f\n",
           t32[REPS / 2] * 1e6, t32[0] * 1e6, t64[REPS / 2] * 1e6, t64[0] * 1e6, t64[REPS / 2] / t32[REPS / 2]);
    return (int)(s32[1] + s64[1]) & 0;
}

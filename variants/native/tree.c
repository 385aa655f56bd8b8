/* Sum/min tree descent and batched update for rbcheck's CPU path.
 *
 * Layout (reference/sum_tree.py): nodes[2 * size], node 1 the root, node k
 * has children 2k and 2k + 1, leaf i at node size + i, node 0 unused.
 *
 * Arithmetic is the reference's float64 arithmetic, operation for operation:
 * compile WITHOUT -ffast-math and with -ffp-contract=off (no fused
 * multiply-add), so every subtraction, addition and comparison here rounds
 * exactly as torch's float64 kernels do and results are bit-identical.
 */
#include <stdint.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <float.h>
#include <pthread.h>

#if defined(__FAST_MATH__)
#error "tree.c must be compiled without -ffast-math: its results must be the reference's bits"
#endif

#define RB_ABI_VERSION 4
/* Prefetch the children of the draw PREFETCH_AHEAD positions ahead (level by
 * level the next addresses are known; ~64 hides the latency of a tree larger
 * than the private caches on the machines measured, 16 was 2x slower), and
 * the row GATHER_AHEAD positions ahead in rb_gather_rows. */
#ifndef PREFETCH_LOCALITY
#define PREFETCH_LOCALITY 3
#endif
#ifndef GATHER_AHEAD
#define GATHER_AHEAD 64
#endif
#ifndef PREFETCH_AHEAD
#define PREFETCH_AHEAD 64
#endif

int64_t rb_abi_version(void) { return RB_ABI_VERSION; }

/* l when flag is 1, +0.0 when it is 0, without a branch (the branch would be
 * mispredicted half the time). x - 0.0 == x bit for bit for every x (-0.0
 * and NaN included) in round-to-nearest, so "x - select_or_zero(l, go)" is
 * the reference's "go ? x - l : x". */
static inline double select_or_zero(double l, int64_t flag)
{
    uint64_t bits;
    memcpy(&bits, &l, sizeof bits);
    bits &= (uint64_t)0 - (uint64_t)flag;
    memcpy(&l, &bits, sizeof l);
    return l;
}

/* For each mass: go left if mass < left or right == 0, else mass -= left and
 * go right. Level-synchronous over the batch: the loads of one level are
 * independent of each other, so the memory system can serve many at once.
 * out_leaf is the working mass during the descent and the leaf value after. */
void rb_find_prefix(const double *nodes, int64_t size, const double *mass, int64_t n,
                    int64_t *out_index, double *out_leaf)
{
    int64_t *node = out_index;
    double *m = out_leaf;
    int depth = 0;
    while (((int64_t)1 << depth) < size) depth++;
    for (int64_t i = 0; i < n; i++) {
        node[i] = 1;
        m[i] = mass[i];
    }
    int level = 0;
    /* Three levels per pass: from node a the next three levels read the pair
     * at 2a, a pair among the four nodes at 4a and one among the eight at 8a
     * (16, 32 and 64 contiguous bytes: one cache line each), so all three can
     * be prefetched at once, and node/mass go through memory a third as often. */
    for (; level + 3 <= depth; level += 3) {
        for (int64_t i = 0; i < n; i++) {
            if (i + PREFETCH_AHEAD < n) {
                int64_t a = node[i + PREFETCH_AHEAD];
                __builtin_prefetch(nodes + 2 * a, 0, PREFETCH_LOCALITY);
                __builtin_prefetch(nodes + 4 * a, 0, PREFETCH_LOCALITY);
                __builtin_prefetch(nodes + 8 * a, 0, PREFETCH_LOCALITY);
            }
            int64_t k = node[i];
            double x = m[i];
            for (int step = 0; step < 3; step++) {
                int64_t left = 2 * k;
                double l = nodes[left], r = nodes[left + 1];
                int64_t go_right = (int64_t)(!(x < l)) & (int64_t)(r != 0.0);
                x = x - select_or_zero(l, go_right);
                k = left + go_right;
            }
            node[i] = k;
            m[i] = x;
        }
    }
    for (; level < depth; level++) {  /* the remaining 0-2 levels */
        for (int64_t i = 0; i < n; i++) {
            if (i + PREFETCH_AHEAD < n)
                __builtin_prefetch(nodes + 2 * node[i + PREFETCH_AHEAD], 0, PREFETCH_LOCALITY);
            int64_t left = 2 * node[i];
            double l = nodes[left], r = nodes[left + 1], x = m[i];
            int64_t go_right = (int64_t)(!(x < l)) & (int64_t)(r != 0.0);
            m[i] = x - select_or_zero(l, go_right);
            node[i] = left + go_right;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n)
            __builtin_prefetch(nodes + node[i + PREFETCH_AHEAD], 0, PREFETCH_LOCALITY);
        out_leaf[i] = nodes[node[i]];
        out_index[i] = node[i] - size;
    }
}

/* 1 when every index[i] is in [0, high), else 0. */
int64_t rb_index_in_range(const int64_t *index, int64_t n, int64_t high)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (index[i] < 0) | (index[i] >= high);
    return !bad;
}

/* 1 when every x[i] is finite and >= 0 (NaN fails), else 0. */
int64_t rb_all_finite_nonneg(const double *x, int64_t n)
{
    int64_t ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= (x[i] >= 0.0) & (x[i] <= DBL_MAX);
    return ok;
}

/* The prioritized sampler's draw: mass = u[i] * total, then rb_find_prefix,
 * then out_base[i] = (leaf / total) * n_rows, the reference's "n * p" before
 * its power (done by the caller with torch, whose pow the reference uses). */
static void sample_chunk(const double *nodes, int64_t size, const double *u, int64_t n,
                         double total, double n_rows, int64_t *out_index, double *out_base)
{
    for (int64_t i = 0; i < n; i++) out_base[i] = u[i] * total;
    rb_find_prefix(nodes, size, out_base, n, out_index, out_base);
    for (int64_t i = 0; i < n; i++) out_base[i] = (out_base[i] / total) * n_rows;
}

typedef struct {
    const double *nodes, *u;
    int64_t size, n;
    double total, n_rows;
    int64_t *out_index;
    double *out_base;
} sample_job;

static void *sample_worker(void *arg)
{
    sample_job *j = (sample_job *)arg;
    sample_chunk(j->nodes, j->size, j->u, j->n, j->total, j->n_rows, j->out_index, j->out_base);
    return NULL;
}

/* Draws are independent, so with n_threads > 1 the batch is cut into that
 * many contiguous chunks run by as many threads (each draw's arithmetic is
 * the same, so are the results). More threads mean more cache misses in
 * flight: the descent is bound by them, not by arithmetic. Chunks of fewer
 * than MIN_CHUNK draws are not worth a thread's start (measured: no gain at
 * 4096 draws, 1.4x at 65536 with two threads). */
void rb_sample_prefix(const double *nodes, int64_t size, const double *u, int64_t n, double total,
                      double n_rows, int64_t *out_index, double *out_base, int64_t n_threads)
{
    enum { MAX_THREADS = 8, MIN_CHUNK = 16384 };
    if (n_threads > MAX_THREADS) n_threads = MAX_THREADS;
    if (n_threads > n / MIN_CHUNK) n_threads = n / MIN_CHUNK;
    if (n_threads <= 1) {
        sample_chunk(nodes, size, u, n, total, n_rows, out_index, out_base);
        return;
    }
    pthread_t thread[MAX_THREADS];
    sample_job job[MAX_THREADS];
    int started[MAX_THREADS] = {0};
    int64_t chunk = (n + n_threads - 1) / n_threads;
    for (int64_t t = 0; t < n_threads; t++) {
        int64_t lo = t * chunk, hi = lo + chunk < n ? lo + chunk : n;
        job[t] = (sample_job){nodes, u + lo, size, hi - lo, total, n_rows, out_index + lo, out_base + lo};
        if (t > 0)  /* a thread that cannot start: its chunk runs here below */
            started[t] = pthread_create(&thread[t], NULL, sample_worker, &job[t]) == 0;
    }
    sample_worker(&job[0]);
    for (int64_t t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(thread[t], NULL);
        else sample_worker(&job[t]);
    }
}

/* out[i] = (float)(w[i] / c): the reference's "... / (n * p_min) ** -beta"
 * and its conversion to float32. */
void rb_divide_to_float(const double *w, int64_t n, double c, float *out)
{
    for (int64_t i = 0; i < n; i++) out[i] = (float)(w[i] / c);
}

static inline double combine(int is_min, double l, double r)
{
    if (!is_min) return l + r;
    /* torch.minimum: NaN propagates */
    if (l != l) return l;
    if (r != r) return r;
    return r < l ? r : l;
}

static void refresh(double *t, int is_min, int64_t k)
{
    t[k] = combine(is_min, t[2 * k], t[2 * k + 1]);
}

/* Set leaves index[i] (where mask is NULL or mask[i] != 0, in order: a
 * repeated index keeps its last value) of tree a to va[i] and, when b is not
 * NULL, of tree b to vb[i] (vb NULL: va[i] if va[i] > 0 else +inf, the min
 * tree of a prioritized sampler); then recompute every ancestor of a written
 * leaf from its final children. Returns 0, or 1 + the position of the first
 * index outside [0, capacity) (nothing written then), or -1 when out of memory
 * (nothing written). An untouched node already equals the combination of its
 * children, so recomputing it is harmless: levels with at most as many nodes
 * as written leaves are recomputed whole (contiguous, cache friendly). */
int64_t rb_update(double *a, int64_t a_is_min, double *b, int64_t b_is_min, int64_t size,
                  int64_t capacity, const int64_t *index, const double *va, const double *vb,
                  const uint8_t *mask, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= capacity) return 1 + i;
    int64_t *node = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!node) return -1;
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i + PREFETCH_AHEAD < n) {
            __builtin_prefetch(a + size + index[i + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
            if (b) __builtin_prefetch(b + size + index[i + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
        }
        if (mask && !mask[i]) continue;
        int64_t k = size + index[i];
        a[k] = va[i];
        if (b) b[k] = vb ? vb[i] : (va[i] > 0 ? va[i] : INFINITY);
        node[count++] = k >> 1;
    }
    int depth = 0;
    while (((int64_t)1 << depth) < size) depth++;
    /* node[] now holds nodes of level depth - 1 (level L spans [2^L, 2^(L+1))) */
    for (int level = depth - 1; level >= 0 && count > 0; level--) {
        int64_t first = (int64_t)1 << level;
        if (first <= count) {  /* dense: this level and all above, whole */
            for (int lv = level; lv >= 0; lv--) {
                int64_t lo = (int64_t)1 << lv, hi = lo << 1;
                for (int64_t k = lo; k < hi; k++) {
                    refresh(a, (int)a_is_min, k);
                    if (b) refresh(b, (int)b_is_min, k);
                }
            }
            break;
        }
        int64_t prev = 0;
        for (int64_t j = 0; j < count; j++) {
            if (j + PREFETCH_AHEAD < count) {
                __builtin_prefetch(a + 2 * node[j + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
                if (b) __builtin_prefetch(b + 2 * node[j + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
            }
            int64_t k = node[j];
            if (k != prev) {  /* consecutive repeats (contiguous writes) once */
                refresh(a, (int)a_is_min, k);
                if (b) refresh(b, (int)b_is_min, k);
                prev = k;
            }
            node[j] = k >> 1;
        }
    }
    free(node);
    return 0;
}

/* Copy rows index[0..n) of each of n_cols row-major columns: column c has
 * rows of row_bytes[c] bytes at src[c], written densely to dst[c]. The
 * columns have n_rows rows; returns 0, or 1 + the position of the first index
 * outside [0, n_rows) (nothing copied then). Plain byte copies (any dtype),
 * with the source rows prefetched ahead. */
int64_t rb_gather_rows(int64_t n_cols, const int64_t *src, const int64_t *row_bytes,
                       const int64_t *dst, const int64_t *index, int64_t n, int64_t n_rows)
{
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= n_rows) return 1 + i;
    for (int64_t c = 0; c < n_cols; c++) {
        const char *from = (const char *)(intptr_t)src[c];
        char *to = (char *)(intptr_t)dst[c];
        int64_t rb = row_bytes[c];
        if (rb % 8 == 0) {
            int64_t w = rb / 8;
            for (int64_t i = 0; i < n; i++) {
                if (i + GATHER_AHEAD < n)
                    __builtin_prefetch(from + index[i + GATHER_AHEAD] * rb, 0, PREFETCH_LOCALITY);
                const uint64_t *s = (const uint64_t *)(from + index[i] * rb);
                uint64_t *d = (uint64_t *)(to + i * rb);
                for (int64_t k = 0; k < w; k++) d[k] = s[k];
            }
        } else if (rb % 4 == 0) {
            int64_t w = rb / 4;
            for (int64_t i = 0; i < n; i++) {
                if (i + GATHER_AHEAD < n)
                    __builtin_prefetch(from + index[i + GATHER_AHEAD] * rb, 0, PREFETCH_LOCALITY);
                const uint32_t *s = (const uint32_t *)(from + index[i] * rb);
                uint32_t *d = (uint32_t *)(to + i * rb);
                for (int64_t k = 0; k < w; k++) d[k] = s[k];
            }
        } else {
            for (int64_t i = 0; i < n; i++) {
                if (i + GATHER_AHEAD < n)
                    __builtin_prefetch(from + index[i + GATHER_AHEAD] * rb, 0, PREFETCH_LOCALITY);
                memcpy(to + i * rb, from + index[i] * rb, (size_t)rb);
            }
        }
    }
    return 0;
}

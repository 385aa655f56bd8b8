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

#define RB_ABI_VERSION 16
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
#ifndef LINE_PASSES
#define LINE_PASSES 2
#endif
#ifndef USE_AVX2
#define USE_AVX2 1
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

/* One step of the reference's rule from node k with children sums l, r:
 * go left if x < l or r == 0, else x -= l and go right. */
#define RB_STEP(k, x, l, r)                                                      \
    do {                                                                         \
        int64_t go_right_ = (int64_t)(!((x) < (l))) & (int64_t)((r) != 0.0);      \
        (x) = (x) - select_or_zero((l), go_right_);                              \
        (k) = 2 * (k) + go_right_;                                               \
    } while (0)

#if defined(__x86_64__) && (defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 5))
#include <immintrin.h> /* the AVX2 descent: GCC 5+ or clang (target attributes) */
#define RB_X86 1
/* Whether the descent uses its AVX2 line pass: the CPU runs AVX2 (asked
 * once; the library is built for any x86-64) and rb_simd has not turned it
 * off. */
static int simd_state = -1;
static int has_avx2(void)
{
    if (simd_state < 0) {
        __builtin_cpu_init();
        simd_state = USE_AVX2 && __builtin_cpu_supports("avx2");
    }
    return simd_state;
}

/* rows r0..r3 of a 4x4 block of doubles to its columns c0..c3 */
#define RB_TRANSPOSE4(r0, r1, r2, r3, c0, c1, c2, c3)                              \
    do {                                                                           \
        __m256d t0_ = _mm256_unpacklo_pd(r0, r1), t1_ = _mm256_unpackhi_pd(r0, r1); \
        __m256d t2_ = _mm256_unpacklo_pd(r2, r3), t3_ = _mm256_unpackhi_pd(r2, r3); \
        c0 = _mm256_permute2f128_pd(t0_, t2_, 0x20);                               \
        c1 = _mm256_permute2f128_pd(t1_, t3_, 0x20);                               \
        c2 = _mm256_permute2f128_pd(t0_, t2_, 0x31);                               \
        c3 = _mm256_permute2f128_pd(t1_, t3_, 0x31);                               \
    } while (0)

/* The line pass (see rb_find_prefix) for draws four at a time with AVX2:
 * the four lines transposed to columns c0..c7 (lane j: draw j), the pairs
 * c0 + c1, ..., the quads, and RB_STEP's comparisons (!(x < l):
 * _CMP_NLT_UQ; r != 0: _CMP_NEQ_UQ) and subtraction of l or +0.0 lane by
 * lane; blends pick the children the scalar code indexes. IEEE operations
 * lane by lane are the scalar ones: bit-identical. Returns how many draws it
 * did (a multiple of 4; the caller does the rest). */
__attribute__((target("avx2"))) static int64_t line_pass_avx2(const double *nodes, int64_t *node,
                                                               double *m, int64_t n)
{
    const __m256d zero = _mm256_setzero_pd();
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        if (i + PREFETCH_AHEAD + 4 <= n)
            for (int j = 0; j < 4; j++)
                __builtin_prefetch(nodes + 8 * node[i + j + PREFETCH_AHEAD], 0, PREFETCH_LOCALITY);
        const double *e0 = nodes + 8 * node[i], *e1 = nodes + 8 * node[i + 1];
        const double *e2 = nodes + 8 * node[i + 2], *e3 = nodes + 8 * node[i + 3];
        __m256d c0, c1, c2, c3, c4, c5, c6, c7;
        RB_TRANSPOSE4(_mm256_loadu_pd(e0), _mm256_loadu_pd(e1), _mm256_loadu_pd(e2),
                      _mm256_loadu_pd(e3), c0, c1, c2, c3);
        RB_TRANSPOSE4(_mm256_loadu_pd(e0 + 4), _mm256_loadu_pd(e1 + 4), _mm256_loadu_pd(e2 + 4),
                      _mm256_loadu_pd(e3 + 4), c4, c5, c6, c7);
        __m256d p0 = _mm256_add_pd(c0, c1), p1 = _mm256_add_pd(c2, c3);
        __m256d p2 = _mm256_add_pd(c4, c5), p3 = _mm256_add_pd(c6, c7);
        __m256d x = _mm256_loadu_pd(m + i);
#define RB_VSTEP(l, r, go)                                                              \
        __m256d go = _mm256_and_pd(_mm256_cmp_pd(x, l, _CMP_NLT_UQ),                    \
                                   _mm256_cmp_pd(r, zero, _CMP_NEQ_UQ));                \
        x = _mm256_sub_pd(x, _mm256_and_pd(l, go))
        __m256d q0 = _mm256_add_pd(p0, p1), q1 = _mm256_add_pd(p2, p3);
        RB_VSTEP(q0, q1, g1);
        __m256d l2 = _mm256_blendv_pd(p0, p2, g1), r2 = _mm256_blendv_pd(p1, p3, g1);
        RB_VSTEP(l2, r2, g2);
        __m256d l3 = _mm256_blendv_pd(_mm256_blendv_pd(c0, c2, g2), _mm256_blendv_pd(c4, c6, g2), g1);
        __m256d r3 = _mm256_blendv_pd(_mm256_blendv_pd(c1, c3, g2), _mm256_blendv_pd(c5, c7, g2), g1);
        RB_VSTEP(l3, r3, g3);
#undef RB_VSTEP
        int b1 = _mm256_movemask_pd(g1), b2 = _mm256_movemask_pd(g2), b3 = _mm256_movemask_pd(g3);
        for (int j = 0; j < 4; j++)
            node[i + j] = 8 * node[i + j] + 4 * ((b1 >> j) & 1) + 2 * ((b2 >> j) & 1) + ((b3 >> j) & 1);
        _mm256_storeu_pd(m + i, x);
    }
    return i;
}
#endif

/* want 0: the descent runs its scalar code; 1: its AVX2 line pass where the
 * CPU has AVX2; -1: unchanged. Returns whether the AVX2 pass is used (for
 * tests and comparisons: both give the same bits). */
int64_t rb_simd(int64_t want)
{
#ifdef RB_X86
    if (want == 0) simd_state = 0;
    if (want == 1) simd_state = -1;  /* re-asked below */
    return has_avx2();
#else
    (void)want;
    return 0;
#endif
}

/* For each mass, the reference's descent (see RB_STEP) from the root to a
 * leaf. out_leaf is the working mass during the descent and the leaf value
 * after; out_index the leaf's position.
 *
 * Level-synchronous over the batch: the loads of one level are independent
 * of each other, so the memory system serves many at once (with software
 * prefetch PREFETCH_AHEAD draws ahead). Three levels per pass, in one of two
 * ways. A stored pass reads the pair at 2a, one among the four nodes at 4a
 * and one among the eight at 8a: three lines, all prefetched at once. A line
 * pass reads ONE line, the eight nodes three levels down (nodes[8a .. 8a + 7],
 * aligned), and recomputes the two levels between with the tree's own
 * operation (pairs n0 + n1, ..., then (n0 + n1) + (n2 + n3), ...). A stored
 * inner node is always exactly that sum (every update and every accepted
 * checkpoint makes it so; reference/sum_tree.py), so the comparisons and
 * subtractions see the bits they would see reading the stored nodes.
 *
 * With AVX2 (x86-64; see rb_simd) every pass is a line pass, four draws at
 * a time (line_pass_avx2). Without it the scalar code uses line passes for
 * the last LINE_PASSES passes only (the big levels, which miss the caches),
 * where they save more than their additions cost. Measured at 2^20 leaves
 * and 4096 draws on a 2-vCPU AMD EPYC (cold caches / warm): scalar stored
 * passes only ~680 / 490 us, scalar with 2 line passes ~380 / 320 us, AVX2
 * line passes ~150 / 80 us. The 0-2 levels that do not fill a pass are done
 * first, near the root. */
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
    for (int level = 0; level < depth % 3; level++) {
        for (int64_t i = 0; i < n; i++) {
            int64_t k = node[i];
            double x = m[i];
            RB_STEP(k, x, nodes[2 * k], nodes[2 * k + 1]);
            node[i] = k;
            m[i] = x;
        }
    }
    int simd = 0;
#ifdef RB_X86
    simd = has_avx2();
#endif
    for (int level = depth % 3; level < depth; level += 3) {
        if (!simd && level + 3 * LINE_PASSES < depth) {  /* upper levels: cached, read as stored */
            for (int64_t i = 0; i < n; i++) {
                if (i + PREFETCH_AHEAD < n) {
                    int64_t a = node[i + PREFETCH_AHEAD];
                    __builtin_prefetch(nodes + 2 * a, 0, PREFETCH_LOCALITY);
                    __builtin_prefetch(nodes + 4 * a, 0, PREFETCH_LOCALITY);
                    __builtin_prefetch(nodes + 8 * a, 0, PREFETCH_LOCALITY);
                }
                int64_t k = node[i];
                double x = m[i];
                for (int step = 0; step < 3; step++)
                    RB_STEP(k, x, nodes[2 * k], nodes[2 * k + 1]);
                node[i] = k;
                m[i] = x;
            }
            continue;
        }
        int64_t start = 0;
#ifdef RB_X86
        if (simd)
            start = line_pass_avx2(nodes, node, m, n);
#endif
        for (int64_t i = start; i < n; i++) {
            if (i + PREFETCH_AHEAD < n)
                __builtin_prefetch(nodes + 8 * node[i + PREFETCH_AHEAD], 0, PREFETCH_LOCALITY);
            const double *e = nodes + 8 * node[i];  /* the eight nodes three levels down */
            double p0 = e[0] + e[1], p1 = e[2] + e[3], p2 = e[4] + e[5], p3 = e[6] + e[7];
            double x = m[i];
            int64_t k = 0;  /* position among the 1, 2, 4, then 8 nodes below node[i] */
            RB_STEP(k, x, p0 + p1, p2 + p3);
            double l = k ? p2 : p0, r = k ? p3 : p1;
            RB_STEP(k, x, l, r);
            RB_STEP(k, x, e[2 * k], e[2 * k + 1]);
            node[i] = 8 * node[i] + k;
            m[i] = x;
        }
    }
    for (int64_t i = 0; i < n; i++) {
        out_leaf[i] = nodes[node[i]];
        out_index[i] = node[i] - size;
    }
}

/* out[i] = the row number last written to slot index[i] by a ring writer
 * that has written write_count rows into capacity slots (-1: never written):
 * reference/writer.py's expected_generation, which a ring writer's
 * generation always equals (its loader refuses anything else). Arithmetic
 * instead of a random read of the generation column per draw, and without a
 * division per draw: after write_count = turns * capacity + r rows, slot
 * s < r last held row turns * capacity + s, slot s >= r row
 * (turns - 1) * capacity + s, or none while turns == 0 (the reference's
 * s + floor((write_count - 1 - s) / capacity) * capacity, case by case).
 * The caller guarantees 0 <= index[i] < capacity. */
void rb_ring_generation(const int64_t *index, int64_t n, int64_t write_count, int64_t capacity,
                        int64_t *out)
{
    const int64_t turns = write_count / capacity, r = write_count % capacity;
    const int64_t newer = turns * capacity, older = turns > 0 ? newer - capacity : -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = index[i];
        out[i] = s < r ? newer + s : (turns > 0 ? older + s : -1);
    }
}

/* index[i] = min((int64) floor(u[i] * size), size - 1): the uniform sampler's
 * map from float64 uniforms in [0, 1) to slots 0 .. size - 1, the reference's
 * torch.floor(u * size).long().clamp_(max=size - 1) op for op (the product in
 * float64 without contraction, an exact floor, an exact conversion below
 * 2^53), in one pass instead of four torch ops and three temporaries. */
void rb_uniform_slots(const double *u, int64_t n, int64_t size, int64_t *index)
{
    const double scale = (double)size;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = (int64_t)floor(u[i] * scale);
        index[i] = s < size - 1 ? s : size - 1;
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

void rb_pow_like_torch(const double *x, double *out, int64_t n, double e, const void *vector_pow); /* pow.c */

/* update_priority's checks, widening and first step of the transform in
 * one pass: 1 when every index[i] is in [0, capacity) and every priority
 * finite and >= 0; then out[i] = priority + eps (the priority widened to a
 * double first: float32 exactly, as torch's conversion; one IEEE addition,
 * as torch's) and *high the larger of *max_priority and the largest
 * priority. 0 otherwise (the caller's full checks then report what is
 * wrong). Nothing is committed here: rb_finish_update does, once the
 * caller's pow has shown that no transform overflows. priority: float32
 * when is_float32, else float64. */
int64_t rb_prepare_update(const int64_t *index, int64_t n, int64_t capacity, const void *priority,
                          int64_t is_float32, double eps, double *out, const double *max_priority,
                          double *high_out)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad |= (index[i] < 0) | (index[i] >= capacity);
    int64_t ok = !bad;
    double high = *max_priority;
    const float *p32 = (const float *)priority;
    const double *p64 = (const double *)priority;
    for (int64_t i = 0; i < n; i++) {
        double x = is_float32 ? (double)p32[i] : p64[i];
        ok &= (x >= 0.0) & (x <= DBL_MAX);
        high = x > high ? x : high;
        out[i] = x + eps;
    }
    *high_out = high;
    return ok;
}

/* update_priority's commit after the transform (p + eps) ** alpha (do_pow:
 * done here first, value = value ** alpha as torch's pow computes it,
 * rb_pow_like_torch with vector_pow; else the caller's torch pow ran): 1 when
 * every value[i] is finite (no transform overflowed float64); then
 * *max_priority becomes *high (rb_prepare_update's). 0 otherwise, with
 * *max_priority unchanged (the caller's full checks report the overflow). */
/* value = value ** alpha as torch's pow computes it when do_pow, then 1 when
 * every value[i] is finite (no transform overflowed float64), else 0. */
static int64_t transformed_finite(double *value, int64_t n, double alpha, const void *vector_pow, int64_t do_pow)
{
    if (do_pow) rb_pow_like_torch(value, value, n, alpha, vector_pow);
    int64_t ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= (value[i] <= DBL_MAX) & (value[i] >= -DBL_MAX);
    return ok;
}

int64_t rb_finish_update(double *value, int64_t n, const double *high, double *max_priority, double alpha,
                         const void *vector_pow, int64_t do_pow)
{
    int64_t ok = transformed_finite(value, n, alpha, vector_pow, do_pow);
    if (ok) *max_priority = *high;
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

/* torch's pow in C: pow.c; the batched update, the shadow levels and the row
 * gather: tree_update.c; a sample's steps strung into two calls: sample.c.
 * All part of this translation unit (kept in their own files for their
 * length). */
#include "pow.c"
#include "tree_update.c"
#include "sample.c"

/* update_priority's happy path in one call, for a caller whose pow is done
 * here (torch_pow.in_c): rb_prepare_update, then value = value ** alpha as
 * torch's pow computes it (rb_pow_like_torch), then, when no transform
 * overflowed, rb_update of the sum tree (sum_nodes) and the min tree
 * (min_nodes) with shadow levels left stale, and *max_priority = *high.
 * Returns 0 when done; 1 when an index or a priority failed its check, 2
 * when a transform overflowed, -1 out of memory: nothing changed then (but
 * value and high, the caller's workspaces; its full checks report why). */
int64_t rb_update_whole(const int64_t *index, int64_t n, int64_t capacity, const void *priority,
                        int64_t is_float32, double eps, double *value, double *max_priority, double *high,
                        double alpha, const void *vector_pow, double *sum_nodes, double *min_nodes,
                        int64_t size)
{
    if (!rb_prepare_update(index, n, capacity, priority, is_float32, eps, value, max_priority, high)) return 1;
    if (!transformed_finite(value, n, alpha, vector_pow, 1)) return 2;
    int64_t *node = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!node) return -1;
    update_with(sum_nodes, 0, min_nodes, 1, size, index, value, NULL, NULL, n, 1, node);
    free(node);
    *max_priority = *high;
    return 0;
}

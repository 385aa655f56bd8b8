/* Batched update of rbcheck's CPU trees: combine and refresh, the shadow
 * levels, the level-synchronous refresh of touched ancestors, rb_update and
 * the row gather. Not compiled alone: tree.c includes it at its end (one
 * translation unit, with tree.c's includes, macros and arithmetic rules).
 */
#ifndef RB_ABI_VERSION
#error "tree_update.c is part of tree.c: compile tree.c"
#endif

static inline double combine(int is_min, double l, double r)
{
    if (!is_min) return l + r;
    /* torch.minimum: NaN propagates (the left one first); selects, no branches */
    double m = r < l ? r : l;
    m = r != r ? r : m;
    return l != l ? l : m;
}

static void refresh(double *t, int is_min, int64_t k)
{
    t[k] = combine(is_min, t[2 * k], t[2 * k + 1]);
}

/* The shadow levels of a tree of depth d >= RB_SHADOW_MIN_DEPTH: d - 1, d - 2,
 * d - 4 and d - 5, the levels the descent's two bottom line passes recompute
 * from the line of eight nodes below them and never read (rb_find_prefix
 * reads levels d, d - 3 and, as stored, only levels <= d - 6 or <= 2; that
 * needs LINE_PASSES >= 2). rb_update with shadow set leaves them stale;
 * rb_materialize recomputes them. Every other level is kept exact. */
#define RB_SHADOW_MIN_DEPTH 6
#if LINE_PASSES < 2
#error "the shadow levels need the descent's bottom two passes to be line passes (LINE_PASSES >= 2)"
#endif

int64_t rb_shadow_min_depth(void) { return RB_SHADOW_MIN_DEPTH; }

static int tree_depth(int64_t size)
{
    int depth = 0;
    while (((int64_t)1 << depth) < size) depth++;
    return depth;
}

/* The node three levels above the eight nodes e[0..7] (one cache line):
 * combined pairwise, then the pairs, then the quads, exactly as the tree
 * stores the two levels between (so the same bits). */
static inline double combine_line(int is_min, const double *e)
{
    return combine(is_min, combine(is_min, combine(is_min, e[0], e[1]), combine(is_min, e[2], e[3])),
                   combine(is_min, combine(is_min, e[4], e[5]), combine(is_min, e[6], e[7])));
}

/* Recompute levels from_level down to to_level (bottom up) of tree t whole.
 * A level's nodes and their children do not overlap (restrict): the loops
 * vectorize, each node still the one operation on its two children. */
static void refresh_level(double *restrict parent, const double *restrict child, int64_t n, int is_min)
{
    if (is_min)
        for (int64_t j = 0; j < n; j++) parent[j] = combine(1, child[2 * j], child[2 * j + 1]);
    else
        for (int64_t j = 0; j < n; j++) parent[j] = child[2 * j] + child[2 * j + 1];
}

static void refresh_levels(double *t, int is_min, int from_level, int to_level)
{
    for (int lv = from_level; lv >= to_level; lv--) {
        int64_t lo = (int64_t)1 << lv;
        refresh_level(t + lo, t + 2 * lo, lo, is_min);
    }
}

/* Recompute the shadow levels (see RB_SHADOW_MIN_DEPTH) of tree t whole,
 * bottom up: d - 1 and d - 2 from the leaves, d - 4 and d - 5 from level
 * d - 3. Afterwards every inner node is the combination of its children.
 * O(size). A tree shallower than RB_SHADOW_MIN_DEPTH has none. */
void rb_materialize(double *t, int64_t is_min, int64_t size)
{
    int depth = tree_depth(size);
    if (depth < RB_SHADOW_MIN_DEPTH) return;
    refresh_levels(t, (int)is_min, depth - 1, depth - 2);
    refresh_levels(t, (int)is_min, depth - 4, depth - 5);
}

/* Level-synchronous refresh of the ancestors of the nodes node[0..count)
 * (all on level `level`, consecutive repeats allowed) from `level` up to
 * the root; node[] is overwritten. A level with at most as many nodes as
 * there are entries is recomputed whole with every level above it
 * (contiguous, cache friendly; an untouched node already equals the
 * combination of its children, so recomputing it is harmless). */
static void refresh_up(double *a, int a_is_min, double *b, int b_is_min, int64_t *node,
                       int64_t count, int level)
{
    for (; level >= 0 && count > 0; level--) {
        if (((int64_t)1 << level) <= count) {  /* dense: this level and all above, whole */
            refresh_levels(a, a_is_min, level, 0);
            if (b) refresh_levels(b, b_is_min, level, 0);
            return;
        }
        int64_t prev = 0;
        for (int64_t j = 0; j < count; j++) {
            if (j + PREFETCH_AHEAD < count) {
                __builtin_prefetch(a + 2 * node[j + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
                if (b) __builtin_prefetch(b + 2 * node[j + PREFETCH_AHEAD], 1, PREFETCH_LOCALITY);
            }
            int64_t k = node[j];
            if (k != prev) {  /* consecutive repeats (contiguous writes) once */
                refresh(a, a_is_min, k);
                if (b) refresh(b, b_is_min, k);
                prev = k;
            }
            node[j] = k >> 1;
        }
    }
}

/* Set leaves index[i] (where mask is NULL or mask[i] != 0, in order: a
 * repeated index keeps its last value) of tree a to va[i] and, when b is not
 * NULL, of tree b to vb[i] (vb NULL: va[i] if va[i] > 0 else +inf, the min
 * tree of a prioritized sampler); then recompute every ancestor of a written
 * leaf from its final children. Returns 0, or 1 + the position of the first
 * index outside [0, capacity) (nothing written then), or -1 when out of memory
 * (nothing written).
 *
 * shadow 0: every level kept exact (the leaves' parents, then level by
 * level up; see refresh_up). The tree's shadow levels must be exact
 * beforehand (rb_materialize), as the untouched children read are.
 * shadow 1 (trees of depth d >= RB_SHADOW_MIN_DEPTH): the shadow levels are
 * not written. Entry by entry, in order, the leaf is written, then its
 * ancestor on level d - 3 is recomputed from the leaf's line (the eight
 * leaves below it: combine_line) and its ancestor on level d - 6 from that
 * node's line; then levels d - 7 .. 0 level by level. Three lines per entry
 * and tree on the large levels instead of seven, with the lines of entries
 * PREFETCH_AHEAD (leaves), / 2 and / 4 ahead prefetched. Each recomputation
 * reads the current values, so the last one of a node (at the last write
 * below it) sees its final leaves: the same bits as the reference's. */
static void update_with(double *a, int64_t a_is_min, double *b, int64_t b_is_min, int64_t size,
                        const int64_t *index, const double *va, const double *vb, const uint8_t *mask,
                        int64_t n, int64_t shadow, int64_t *node);

int64_t rb_update(double *a, int64_t a_is_min, double *b, int64_t b_is_min, int64_t size,
                  int64_t capacity, const int64_t *index, const double *va, const double *vb,
                  const uint8_t *mask, int64_t n, int64_t shadow)
{
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= capacity) return 1 + i;
    int64_t *node = (int64_t *)malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (!node) return -1;
    update_with(a, a_is_min, b, b_is_min, size, index, va, vb, mask, n, shadow, node);
    free(node);
    return 0;
}

/* rb_update's writes, the indices checked, with node[0..n) as its workspace. */
static void update_with(double *a, int64_t a_is_min, double *b, int64_t b_is_min, int64_t size,
                        const int64_t *index, const double *va, const double *vb, const uint8_t *mask,
                        int64_t n, int64_t shadow, int64_t *node)
{
    int depth = tree_depth(size), am = (int)a_is_min, bm = (int)b_is_min;
    int64_t count = 0;
    if (shadow && depth >= RB_SHADOW_MIN_DEPTH) {
        enum { AHEAD = PREFETCH_AHEAD };
        for (int64_t i = 0; i < n; i++) {
            if (i + AHEAD < n) {
                int64_t k = size + index[i + AHEAD];
                __builtin_prefetch(a + k, 1, PREFETCH_LOCALITY);
                if (b) __builtin_prefetch(b + k, 1, PREFETCH_LOCALITY);
            }
            if (i + AHEAD / 2 < n) {
                int64_t k = (size + index[i + AHEAD / 2]) >> 3;
                __builtin_prefetch(a + k, 1, PREFETCH_LOCALITY);
                if (b) __builtin_prefetch(b + k, 1, PREFETCH_LOCALITY);
            }
            if (i + AHEAD / 4 < n) {
                int64_t k = (size + index[i + AHEAD / 4]) >> 6;
                __builtin_prefetch(a + k, 1, PREFETCH_LOCALITY);
                if (b) __builtin_prefetch(b + k, 1, PREFETCH_LOCALITY);
            }
            if (mask && !mask[i]) continue;
            int64_t k = size + index[i], p = k >> 3, q = p >> 3;
            a[k] = va[i];
            a[p] = combine_line(am, a + 8 * p);
            a[q] = combine_line(am, a + 8 * q);
            if (b) {
                b[k] = vb ? vb[i] : (va[i] > 0 ? va[i] : INFINITY);
                b[p] = combine_line(bm, b + 8 * p);
                b[q] = combine_line(bm, b + 8 * q);
            }
            node[count++] = q >> 1;
        }
        refresh_up(a, am, b, bm, node, count, depth - 7);
        return;
    }
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
    /* node[] now holds nodes of level depth - 1 (level L spans [2^L, 2^(L+1))) */
    refresh_up(a, am, b, bm, node, count, depth - 1);
}

/* Set the n leaves first .. first + n - 1 (contiguous: an extend; the caller
 * splits a ring wrap into two calls) of tree a to va[0..n) and, when b is not
 * NULL, of tree b to (va[i] > 0 ? va[i] : +inf); then recompute each ancestor
 * of the range ONCE, level by level over the (halving) range of nodes above
 * it, from its final children: rb_update's result (the same bits) without
 * recomputing a line's ancestors once per leaf below them. Returns 0, or 1
 * when the range is not within [0, capacity) (nothing written).
 *
 * shadow 0: every level recomputed (the tree's shadow levels must be exact
 * beforehand, as for rb_update). shadow 1 (depth d >= RB_SHADOW_MIN_DEPTH):
 * as rb_update, the shadow levels are not written: the range's nodes on
 * level d - 3 are recomputed from their lines of leaves (combine_line), those
 * on level d - 6 from their lines on level d - 3, then levels d - 7 .. 0. */
static void refresh_range(double *t, int is_min, int64_t lo, int64_t hi)
{
    for (int64_t k = lo; k <= hi; k++) t[k] = combine(is_min, t[2 * k], t[2 * k + 1]);
}

static void line_range(double *t, int is_min, int64_t lo, int64_t hi)
{
    for (int64_t k = lo; k <= hi; k++) t[k] = combine_line(is_min, t + 8 * k);
}

int64_t rb_update_range(double *a, int64_t a_is_min, double *b, int64_t b_is_min, int64_t size,
                        int64_t capacity, int64_t first, int64_t n, const double *va, int64_t shadow)
{
    if (n <= 0) return 0;
    if (first < 0 || first > capacity - n) return 1;
    int depth = tree_depth(size), am = (int)a_is_min, bm = (int)b_is_min;
    int64_t lo = size + first, hi = size + first + n - 1;
    for (int64_t i = 0; i < n; i++) a[lo + i] = va[i];
    if (b)
        for (int64_t i = 0; i < n; i++) b[lo + i] = va[i] > 0 ? va[i] : INFINITY;
    if (shadow && depth >= RB_SHADOW_MIN_DEPTH) {
        lo >>= 3, hi >>= 3;  /* level d - 3 */
        line_range(a, am, lo, hi);
        if (b) line_range(b, bm, lo, hi);
        lo >>= 3, hi >>= 3;  /* level d - 6 */
        line_range(a, am, lo, hi);
        if (b) line_range(b, bm, lo, hi);
    }
    while (lo > 1) {
        lo >>= 1, hi >>= 1;
        refresh_range(a, am, lo, hi);
        if (b) refresh_range(b, bm, lo, hi);
    }
    return 0;
}

/* Draws per block of rb_gather_rows (every column of a block, then the next). */
#define RB_GATHER_BLOCK 64

/* Copy rows index[0..n) of each of n_cols columns: column c has rows of
 * row_bytes[c] contiguous bytes starting every stride[c] bytes from src[c]
 * (stride == row_bytes: a row-major tensor; larger: a field of interleaved
 * rows), written densely to dst[c]. The columns have n_rows rows; returns
 * 0, or 1 + the position of the first index outside [0, n_rows) (nothing
 * copied then). Plain byte copies (any dtype), with every cache line of the
 * source row prefetched GATHER_AHEAD draws ahead. Block by block
 * (RB_GATHER_BLOCK draws), column after column within a block: when the
 * columns are fields of the same interleaved rows, the first brings each row
 * into the cache and the others find it there, still in L1. Column after
 * column over all n draws, with only a row's first line prefetched, a cold
 * uniform sample of 4096 rows (2^20 slots) took 564-660 us at width 8 and
 * 1211-1286 us at width 64; blocked, 367-444 and 763-844 us (medians of 60,
 * 32 MiB written between calls, two alternating runs). */
int64_t rb_gather_rows(int64_t n_cols, const int64_t *src, const int64_t *stride,
                       const int64_t *row_bytes, const int64_t *dst, const int64_t *index,
                       int64_t n, int64_t n_rows)
{
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= n_rows) return 1 + i;
    for (int64_t b0 = 0; b0 < n; b0 += RB_GATHER_BLOCK) {
        int64_t b1 = n - b0 < RB_GATHER_BLOCK ? n : b0 + RB_GATHER_BLOCK;
        for (int64_t c = 0; c < n_cols; c++) {
            const char *from = (const char *)(intptr_t)src[c];
            char *to = (char *)(intptr_t)dst[c];
            int64_t rb = row_bytes[c], st = stride[c];
#define RB_GATHER_LOOP(word_t)                                                              \
            do {                                                                            \
                int64_t w = rb / (int64_t)sizeof(word_t);                                   \
                for (int64_t i = b0; i < b1; i++) {                                         \
                    if (i + GATHER_AHEAD < n) {                                             \
                        const char *p_ = from + index[i + GATHER_AHEAD] * st;               \
                        for (intptr_t l_ = (intptr_t)p_ & ~(intptr_t)63; l_ < (intptr_t)(p_ + rb); l_ += 64) \
                            __builtin_prefetch((const void *)l_, 0, PREFETCH_LOCALITY);     \
                    }                                                                       \
                    const word_t *s_ = (const word_t *)(from + index[i] * st);              \
                    word_t *d_ = (word_t *)(to + i * rb);                                   \
                    for (int64_t k = 0; k < w; k++) d_[k] = s_[k];                          \
                }                                                                           \
            } while (0)
            /* word copies when rows, strides and pointers allow them (the usual
             * case: the compiler turns them into a few moves), bytes otherwise */
            int64_t align = (int64_t)(src[c] | dst[c] | rb | st);
            if (align % 8 == 0)
                RB_GATHER_LOOP(uint64_t);
            else if (align % 4 == 0)
                RB_GATHER_LOOP(uint32_t);
            else
                RB_GATHER_LOOP(uint8_t);
#undef RB_GATHER_LOOP
        }
    }
    return 0;
}

/* The arguments of rb_extend_prepare and rb_extend: one block that the caller
 * fills with one pack (a call with many arguments costs more through ctypes
 * than the work of a small extend). Every field is 8 bytes (a 64-bit ABI). */
typedef struct {
    int64_t n_cols;         /* columns of the table below */
    const int64_t *cols;    /* per column: source address, destination address,
                               destination row stride (bytes), row bytes */
    int64_t capacity;       /* ring slots */
    int64_t first;          /* the first row's slot, in [0, capacity) */
    int64_t n;              /* rows, in [1, capacity] */
    int64_t write_count;    /* the writer's count before this write */
    int64_t *generation;    /* int64[capacity] */
    int64_t *index_out;     /* int64[n]: the slots written */
    double *sum;            /* the sum tree's nodes (NULL: a uniform buffer) */
    double *min;            /* the min tree's nodes */
    int64_t size;           /* the trees' leaves */
    double *value;          /* float64[n]: the transformed priorities */
    int64_t shadow;         /* as rb_update_range */
    double *high;           /* one float64: the max priority to commit */
    double *max_priority;   /* one float64 */
    const void *priority;   /* the raw priorities (NULL: the max priority) */
    int64_t is_float32;     /* raw priorities float32 (else float64) */
    double eps;
    int64_t do_pow;         /* rb_extend_prepare finishes the transform as torch's pow */
    double alpha;
    const void *vector_pow; /* rb_pow_like_torch's vector pow (NULL: libm's pow throughout) */
} rb_extend_args;

typedef char rb_extend_args_is_packed[sizeof(rb_extend_args) == 21 * 8 ? 1 : -1];

int64_t rb_extend_args_size(void) { return (int64_t)sizeof(rb_extend_args); }

/* extend's priorities up to the pow, in one pass: value[i] = raw[i] + eps for
 * the n raw priorities (widened to a double first, as torch converts;
 * priority NULL: every row gets *max_priority, the reference's torch.full)
 * and *high the larger of *max_priority and their maximum. Returns 1 when
 * every raw priority is finite and >= 0, else 0 (nothing promised of value
 * and *high; the caller's full path reports what is wrong). Nothing is
 * committed: rb_extend does, once the pow has shown that no transform
 * overflows.
 *
 * do_pow: then value = (raw + eps) ** alpha here, as torch's pow computes it
 * (rb_pow_like_torch with vector_pow, pow.c). The caller sets it only after
 * torch_pow.agrees(alpha) found the two equal bit for bit, and for fewer
 * rows than torch's parallel grain (extend_fast.py). */
int64_t rb_extend_prepare(const rb_extend_args *x)
{
    double high = *x->max_priority, eps = x->eps, *out = x->value;
    int64_t n = x->n;
    if (!x->priority) {
        double v = high + eps;
        for (int64_t i = 0; i < n; i++) out[i] = v;
        if (x->do_pow) rb_pow_like_torch(out, out, n, x->alpha, x->vector_pow);
        *x->high = high;
        return 1;
    }
    int64_t ok = 1;
    const float *p32 = (const float *)x->priority;
    const double *p64 = (const double *)x->priority;
    for (int64_t i = 0; i < n; i++) {
        double v = x->is_float32 ? (double)p32[i] : p64[i];
        ok &= (v >= 0.0) & (v <= DBL_MAX);
        high = v > high ? v : high;
        out[i] = v + eps;
    }
    *x->high = high;
    if (x->do_pow && ok) rb_pow_like_torch(out, out, n, x->alpha, x->vector_pow);
    return ok;
}

/* Rows r0 .. r1 - 1 of one column (a contiguous source of rb bytes per row)
 * to destination slots s0, s0 + 1, ... (rows ts bytes apart): one loop per
 * column, its word size and count decided once, so that for the common row
 * sizes the compiler emits a few moves per row with no inner loop (row by
 * row with a per-row size check cost more than the copy itself: an extend
 * of 65536 rows of width 8 ran at about half the speed of memory). */
#define RB_COPY_ROWS(T, WORDS)                                                    \
    for (int64_t r = r0; r < r1; r++) {                                         \
        T *restrict d = (T *)(to + (s0 + (r - r0)) * ts);                        \
        const T *restrict f = (const T *)(from + r * rb);                        \
        for (int64_t k = 0; k < (WORDS); k++) d[k] = f[k];                      \
    }
#define RB_COPY_CASES(T)                                                          \
    switch (rb / (int64_t)sizeof(T)) {                                          \
    case 1: RB_COPY_ROWS(T, 1) return;                                          \
    case 2: RB_COPY_ROWS(T, 2) return;                                          \
    case 3: RB_COPY_ROWS(T, 3) return;                                          \
    case 4: RB_COPY_ROWS(T, 4) return;                                          \
    case 8: RB_COPY_ROWS(T, 8) return;                                          \
    case 16: RB_COPY_ROWS(T, 16) return;                                        \
    case 32: RB_COPY_ROWS(T, 32) return;                                        \
    default: RB_COPY_ROWS(T, rb / (int64_t)sizeof(T)) return;                   \
    }

/* Rows per block of rb_extend's copies (a block of 64-byte rows: 8 KiB). */
#define RB_EXTEND_BLOCK 128

static void copy_rows(char *to, int64_t ts, int64_t s0, const char *from, int64_t rb,
                      int64_t r0, int64_t r1)
{
    int64_t align = (int64_t)(intptr_t)to | (int64_t)(intptr_t)from | ts | rb;
    if (align % 8 == 0) {
        RB_COPY_CASES(uint64_t)
    } else if (align % 4 == 0) {
        RB_COPY_CASES(uint32_t)
    }
    for (int64_t r = r0; r < r1; r++)
        memcpy(to + (s0 + (r - r0)) * ts, from + r * rb, (size_t)rb);
}

/* The whole write of an extend of n rows (1 <= n <= capacity) from ring slot
 * `first` (row r to slot (first + r) mod capacity), after the caller's
 * checks and, for a prioritized buffer, rb_extend_prepare and its pow:
 *
 *  1. sum not NULL: when any value[i] is not finite (a transform overflowed
 *     float64) returns 1 and NOTHING is written (the caller's full path
 *     raises the reference's error). Else the trees' leaves at the slots
 *     become value (sum) and value > 0 ? value : +inf (min), as
 *     rb_update_range (one range, or two when the ring wraps: each ancestor
 *     recomputed once, the same bits), and *max_priority = *high;
 *  2. the rows: column c's row r to its row at slot(r), row after row (the
 *     columns of one destination row side by side when they are fields of
 *     interleaved rows);
 *  3. generation[slot(r)] = write_count + r and index_out[r] = slot(r).
 *
 * Steps 2 and 3 run block by block (RB_EXTEND_BLOCK rows: every column, then
 * the generations and slots), so the destination rows a block's columns
 * share stay in the L1 cache between them. One pass per column over all n
 * rows, as before, brought each interleaved row back from beyond the L2
 * cache once per column once n rows outgrew it: an extend of 65536 rows of
 * width 8 took 1.05-1.4 ms in C that way and 0.73-0.96 ms in blocks of 64 to
 * 512 rows (a C benchmark with 64 MiB written between calls, medians of 60,
 * several runs).
 *
 * Returns 0 when written, 1 (overflow) or 2 (arguments outside the
 * contract) with nothing written. */
int64_t rb_extend(const rb_extend_args *x)
{
    int64_t n = x->n, capacity = x->capacity, first = x->first, count = x->write_count;
    if (n < 1 || n > capacity || first < 0 || first >= capacity) return 2;
    int64_t head = capacity - first < n ? capacity - first : n;
    if (x->sum) {
        const double *value = x->value;
        int64_t ok = 1;
        for (int64_t i = 0; i < n; i++) ok &= (value[i] <= DBL_MAX) & (value[i] >= -DBL_MAX);
        if (!ok) return 1;
        if (rb_update_range(x->sum, 0, x->min, 1, x->size, capacity, first, head, value, x->shadow))
            return 2;
        if (head < n) rb_update_range(x->sum, 0, x->min, 1, x->size, capacity, 0, n - head, value + head, x->shadow);
        *x->max_priority = *x->high;
    }
    const int64_t *cols = x->cols;
    int64_t *generation = x->generation, *index_out = x->index_out;
    for (int64_t seg = 0; seg < 2; seg++) {
        int64_t s0 = seg ? 0 : first, r0 = seg ? head : 0, r1 = seg ? n : head;
        for (int64_t b0 = r0; b0 < r1; b0 += RB_EXTEND_BLOCK) {
            int64_t b1 = r1 - b0 < RB_EXTEND_BLOCK ? r1 : b0 + RB_EXTEND_BLOCK, sb = s0 + (b0 - r0);
            for (int64_t c = 0; c < x->n_cols; c++) {
                const int64_t *col = cols + 4 * c;
                copy_rows((char *)(intptr_t)col[1], col[2], sb, (const char *)(intptr_t)col[0], col[3], b0, b1);
            }
            for (int64_t r = b0; r < b1; r++) {
                generation[sb + (r - b0)] = count + r;
                index_out[r] = sb + (r - b0);
            }
        }
    }
    return 0;
}

/* rb_extend_prepare then rb_extend in one call, for a caller with nothing to
 * do between them (do_pow set, or no trees): returns rb_extend's code, or 3
 * (a raw priority not finite or < 0) with nothing written. */
int64_t rb_extend_whole(const rb_extend_args *x)
{
    if (x->sum && !rb_extend_prepare(x)) return 3;
    return rb_extend(x);
}

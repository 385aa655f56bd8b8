/* A sample's work on the CPU in two calls (sample_fast.py): one argument
 * block that the caller keeps per output block and fills with a few
 * assignments (a ctypes call per step, each with its own arguments, cost
 * more in a cold sample than the steps' work). Part of tree.c's translation
 * unit: the same flags, so the same bits as the calls it strings together.
 *
 * Every field is 8 bytes (a 64-bit ABI); pointers NULL as 0. */
typedef struct {
    int64_t n_cols;         /* columns of the table below */
    const int64_t *cols;    /* 4 * n_cols: sources, row strides (bytes), row bytes, destinations */
    int64_t n;              /* draws */
    const double *u;        /* float64[n]: the caller's uniforms (the reference's draw) */
    int64_t size;           /* rows held: the uniform slots' range, the weights' n */
    int64_t *index;         /* int64[n] out: the slots */
    const double *nodes;    /* the sum tree's nodes (NULL: a uniform sample) */
    int64_t tree_size;      /* the tree's leaves */
    double total;           /* the sum tree's root */
    double *leaf;           /* float64[n]: n * (leaf / total), then (after the caller's pow) the weights' numerators */
    double divisor;         /* (n * p_min) ** -beta */
    float *weight;          /* float32[n] out */
    int64_t *generation;    /* int64[n] out */
    int64_t write_count;    /* the ring writer's count */
    int64_t capacity;       /* ring slots: the generations' ring and the gather's bound */
    int64_t threads;        /* rb_sample_prefix's n_threads */
    int64_t do_pow;         /* rb_sample_rows raises leaf to exponent first, as torch's pow */
    double exponent;        /* -beta */
    const void *vector_pow; /* rb_pow_like_torch's vector pow (NULL: libm's pow throughout) */
} rb_sample_args;

typedef char rb_sample_args_is_packed[sizeof(rb_sample_args) == 19 * 8 ? 1 : -1];

int64_t rb_sample_args_size(void) { return (int64_t)sizeof(rb_sample_args); }

/* A prioritized sample up to the pow: rb_sample_prefix (mass = u * total,
 * the descent, n * (leaf / total)). */
void rb_sample_descend(const rb_sample_args *a)
{
    rb_sample_prefix(a->nodes, a->tree_size, a->u, a->n, a->total, (double)a->size, a->index,
                     a->leaf, a->threads);
}

/* The rest of a sample: a uniform one's slots from its uniforms
 * (rb_uniform_slots), or a prioritized one's weights (do_pow: leaf **
 * exponent as torch's pow, rb_pow_like_torch; else the caller's pow ran;
 * then rb_divide_to_float); then the generations (rb_ring_generation) and
 * the rows (rb_gather_rows: 0, or 1 + the position of an index outside
 * [0, capacity), nothing copied). */
int64_t rb_sample_rows(const rb_sample_args *a)
{
    if (a->nodes == NULL)
        rb_uniform_slots(a->u, a->n, a->size, a->index);
    else {
        if (a->do_pow) rb_pow_like_torch(a->leaf, a->leaf, a->n, a->exponent, a->vector_pow);
        rb_divide_to_float(a->leaf, a->n, a->divisor, a->weight);
    }
    rb_ring_generation(a->index, a->n, a->write_count, a->capacity, a->generation);
    const int64_t k = a->n_cols;
    return rb_gather_rows(k, a->cols, a->cols + k, a->cols + 2 * k, a->cols + 3 * k, a->index, a->n,
                          a->capacity);
}

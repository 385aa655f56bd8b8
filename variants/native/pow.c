/* torch's CPU pow of a float64 tensor by a double exponent, bit for bit
 * (the transform (p + eps) ** alpha of extend and the weights' bases
 * (n * P) ** -beta of sample; see torch_pow.py).
 *
 * torch's kernel for a contiguous float64 tensor whose exponent it does not
 * special-case (0, 1, 2, 3, 0.5, -0.5, -1, -2) runs, below its parallel
 * grain (32768 elements) or on one thread, ONE loop over the elements: pairs
 * of vectors through its vector pow (with AVX2: SLEEF's Sleef_powd4_u10, 4
 * doubles per vector, so 8 elements per step) up to n - n % 8, then the rest
 * one by one through std::pow (libm's pow). rb_pow_like_torch does the
 * same, calling the same two functions: vector_pow points to a pair
 * (rb_vector_pow, made by torch_pow.py): the function torch's kernel calls
 * (found in torch's own library) and its doubles per vector; NULL for
 * element-wise libm throughout (torch's kernel without a vector unit, and
 * any tensor of fewer than one vector pair). With AVX512 the function is
 * Sleef_powd8_u10, 8 doubles, 16 elements per step, up to n - n % 16. The
 * caller uses it only after a probe found it equal to torch's pow bit for
 * bit (torch_pow.agrees), otherwise torch's pow.
 *
 * Part of tree.c's translation unit. In place when out == x. */
typedef struct {
    const void *fn;  /* the vector pow torch's kernel calls */
    int64_t lanes;   /* doubles per vector: 4 (AVX2) or 8 (AVX512) */
} rb_vector_pow;

#if defined(RB_X86)
typedef __m256d (*rb_powd4_fn)(__m256d, __m256d);
typedef __m512d (*rb_powd8_fn)(__m512d, __m512d);

__attribute__((target("avx512f"))) static void pow_avx512(const double *x, double *out, int64_t n, double e,
                                                          const void *vector_pow)
{
    rb_powd8_fn f = (rb_powd8_fn)(intptr_t)vector_pow;
    const __m512d ev = _mm512_set1_pd(e);
    int64_t i = 0, v = n - n % 16;
    for (; i < v; i += 8) _mm512_storeu_pd(out + i, f(_mm512_loadu_pd(x + i), ev));
    for (; i < n; i++) out[i] = pow(x[i], e);
}

__attribute__((target("avx2"))) static void pow_avx2(const double *x, double *out, int64_t n, double e,
                                                     const void *vector_pow)
{
    rb_powd4_fn f = (rb_powd4_fn)(intptr_t)vector_pow;
    const __m256d ev = _mm256_set1_pd(e);
    int64_t i = 0, v = n - n % 8;
    for (; i < v; i += 4) _mm256_storeu_pd(out + i, f(_mm256_loadu_pd(x + i), ev));
    for (; i < n; i++) out[i] = pow(x[i], e);
}
#endif

void rb_pow_like_torch(const double *x, double *out, int64_t n, double e, const void *vector_pow)
{
#if defined(RB_X86)
    const rb_vector_pow *vp = (const rb_vector_pow *)vector_pow;
    if (vp && vp->lanes == 8) {
        if (n >= 16 && __builtin_cpu_supports("avx512f")) {
            pow_avx512(x, out, n, e, vp->fn);
            return;
        }
    } else if (vp && vp->lanes == 4 && n >= 8 && __builtin_cpu_supports("avx2")) {
        pow_avx2(x, out, n, e, vp->fn);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) out[i] = pow(x[i], e);
}

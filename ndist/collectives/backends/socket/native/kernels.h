/*
 * Reduction kernels of the native same-host engine: dst[i] = a[i] (op) b[i].
 *
 * Header-only (static functions), C11, no Python.h. One entry point:
 *
 *     int nd_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op);
 *
 * dtype: index in _DTYPES of _frame.py; op: index in REDOPS of _frame.py. AVG and
 * PREMUL_SUM reduce as SUM (the caller finalizes). dst may be a or b (the same
 * pointer), never a partial overlap; a may be b. Pointers need no alignment.
 * Returns 0, or -1 for a (dtype, op) pair this file does not compute: the caller
 * then reduces with NumPy, as the Python engine does.
 *
 * Every result is bit-identical to NumPy's ufunc(a, b, out=dst) (ml_dtypes' for
 * bfloat16), NaN payloads and signed zeros included, which is why some rules below
 * look arbitrary: they are what NumPy 2.4 / ml_dtypes 0.6 compute on x86-64
 * (tests/collectives/backends/test_native_kernels.py checks every pair bitwise).
 * The one exception is NumPy's own: see float32/float64 add/multiply.
 *
 *  - bool: SUM, MAX, BOR = logical or; PRODUCT, MIN, BAND = logical and; BXOR =
 *    logical xor; any non-zero byte is true, results are 0/1 bytes.
 *  - integers wrap (computed in unsigned arithmetic: no undefined behaviour).
 *  - float32/float64 add/multiply: plain IEEE operations. With a NaN on both sides
 *    NumPy itself returns the first operand's payload from its vector loop and the
 *    second's from its scalar tail (float32 on AVX2: np.add of two 20-element NaN
 *    arrays gives a's payload in [0:16] and b's in [16:20]; a 1-element in-place
 *    np.add gives b's), so "one of the two NaNs, quieted" is all that can match;
 *    here it is the one the CPU gives for a + b (the first, on x86).
 *    minimum(a, b) = isnan(a) || a < b ? a : b; maximum with a > b. So a NaN is
 *    returned as it is (not quieted), the first of two NaNs wins, and of two
 *    zeros the second operand: minimum(-0.0, 0.0) is +0.0 (minps semantics).
 *  - float16: NumPy converts to float, computes, rounds back to nearest even
 *    (overflow to inf). With two NaNs the *second* operand's payload wins (the
 *    order NumPy's compiled loop computes in, at every length): a NaN b gives b
 *    quieted (| 0x200). minimum(a, b) = isnan(a) || a <= b ? a : b, so here of two
 *    zeros the *first* operand comes out; maximum with a >= b.
 *  - bfloat16 (ml_dtypes): float op, then round to nearest even; every NaN result
 *    becomes 0x7fc0 with the sign of the NaN that came out (the second operand's
 *    when both are NaN, x86's default NaN 0xffc0 for inf - inf). minimum/maximum
 *    as float32 (a < b / a > b, NaN a returned unchanged).
 *  - complex64/complex128: SUM componentwise. PRODUCT returns -1: NumPy's SIMD
 *    loop computes re = fma(ar, br, -(ai*bi)), im = fma(ar, bi, ai*br) where the
 *    CPU has FMA (every element on x86-64-v3) and the unfused formula where it has
 *    none (or where NPY_DISABLE_CPU_FEATURES says so): no one formula here is
 *    bit-identical on every machine.
 *  - float8_e4m3fn / float8_e5m2: -1 (rare; NumPy/ml_dtypes does them).
 *  - on other CPUs than x86 every floating-point pair returns -1: NumPy's min/max
 *    and NaN rules follow the CPU's own instructions there, and this file has not
 *    been checked against them.
 *
 * No expression here multiplies and adds, but the extension is built with
 * -ffp-contract=off anyway (GCC does not implement the pragma below): a fused
 * multiply-add would change results in the last bit.
 */
#ifndef NDIST_NATIVE_KERNELS_H
#define NDIST_NATIVE_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if !defined(__GNUC__) || defined(__clang__) /* GCC ignores it, with a warning */
#pragma STDC FP_CONTRACT OFF
#endif

/* dtype codes: _frame._DTYPES */
enum {
    ND_BOOL = 1, ND_INT8, ND_UINT8, ND_INT16, ND_UINT16, ND_INT32, ND_UINT32, ND_INT64,
    ND_UINT64, ND_FLOAT16, ND_FLOAT32, ND_FLOAT64, ND_COMPLEX64, ND_COMPLEX128, ND_BFLOAT16,
    ND_FLOAT8_E4M3FN, ND_FLOAT8_E5M2
};
/* reduce op codes: _frame.REDOPS */
enum {
    ND_SUM = 1, ND_PRODUCT, ND_MIN, ND_MAX, ND_AVG, ND_BAND, ND_BOR, ND_BXOR, ND_PREMUL_SUM
};

#if defined(__x86_64__) || defined(__i386__) || defined(_M_X64) || defined(_M_IX86)
#define ND_FLOAT_KERNELS 1
#else
#define ND_FLOAT_KERNELS 0
#endif

/* Element types for loads and stores: any alignment, any aliasing (buffers come
   from shared memory at any offset). */
#if defined(__GNUC__)
#define ND_ANY __attribute__((aligned(1), may_alias))
#else
#define ND_ANY
#endif
typedef uint8_t ND_ANY nd_u8;
typedef uint16_t ND_ANY nd_u16;
typedef uint32_t ND_ANY nd_u32;
typedef uint64_t ND_ANY nd_u64;
typedef int8_t ND_ANY nd_i8;
typedef int16_t ND_ANY nd_i16;
typedef int32_t ND_ANY nd_i32;
typedef int64_t ND_ANY nd_i64;
typedef float ND_ANY nd_f32;
typedef double ND_ANY nd_f64;

typedef void (*nd_kernel)(void *, const void *, const void *, size_t);

/* One function per (element type, operation). Three loops, by aliasing, so that
   each is a plain loop over restrict pointers that the compiler vectorizes. */
#define ND_LOOP(NAME, T, OP)                                                          \
    static void NAME(void *dst, const void *a, const void *b, size_t n)              \
    {                                                                                 \
        if (dst == a && a == b) {                                                     \
            T *d = (T *)dst;                                                          \
            for (size_t i = 0; i < n; i++) d[i] = OP(d[i], d[i]);                     \
        } else if (dst == a) {                                                        \
            T *restrict d = (T *)dst;                                                 \
            const T *restrict y = (const T *)b;                                       \
            for (size_t i = 0; i < n; i++) d[i] = OP(d[i], y[i]);                     \
        } else if (dst == b) {                                                        \
            T *restrict d = (T *)dst;                                                 \
            const T *restrict x = (const T *)a;                                       \
            for (size_t i = 0; i < n; i++) d[i] = OP(x[i], d[i]);                     \
        } else {                                                                      \
            T *restrict d = (T *)dst;                                                 \
            const T *restrict x = (const T *)a;                                       \
            const T *restrict y = (const T *)b;                                       \
            for (size_t i = 0; i < n; i++) d[i] = OP(x[i], y[i]);                     \
        }                                                                             \
    }

/* ---- bool: logical operations on "byte != 0" ---- */
#define ND_LOR(x, y) ((uint8_t)(((x) | (y)) != 0))
#define ND_LAND(x, y) ((uint8_t)(((x) != 0) & ((y) != 0)))
#define ND_LXOR(x, y) ((uint8_t)(((x) != 0) ^ ((y) != 0)))
ND_LOOP(nd_bool_or, nd_u8, ND_LOR)
ND_LOOP(nd_bool_and, nd_u8, ND_LAND)
ND_LOOP(nd_bool_xor, nd_u8, ND_LXOR)

/* ---- integers: add, multiply and bitwise ops in unsigned arithmetic (wraps, the
   same bits as two's complement); "* 1u" promotes narrow types to unsigned int,
   never to int, whose overflow would be undefined ---- */
#define ND_ADD(x, y) ((x) + (y))
#define ND_IMUL(x, y) ((x) * 1u * (y))
#define ND_AND(x, y) ((x) & (y))
#define ND_OR(x, y) ((x) | (y))
#define ND_XOR(x, y) ((x) ^ (y))
#define ND_IMIN(x, y) ((x) < (y) ? (x) : (y))
#define ND_IMAX(x, y) ((x) > (y) ? (x) : (y))

#define ND_UINT_KERNELS(W)                                                            \
    ND_LOOP(nd_u##W##_add, nd_u##W, ND_ADD)                                           \
    ND_LOOP(nd_u##W##_mul, nd_u##W, ND_IMUL)                                          \
    ND_LOOP(nd_u##W##_and, nd_u##W, ND_AND)                                           \
    ND_LOOP(nd_u##W##_or, nd_u##W, ND_OR)                                             \
    ND_LOOP(nd_u##W##_xor, nd_u##W, ND_XOR)                                           \
    ND_LOOP(nd_u##W##_min, nd_u##W, ND_IMIN)                                          \
    ND_LOOP(nd_u##W##_max, nd_u##W, ND_IMAX)                                          \
    ND_LOOP(nd_i##W##_min, nd_i##W, ND_IMIN)                                          \
    ND_LOOP(nd_i##W##_max, nd_i##W, ND_IMAX)
ND_UINT_KERNELS(8)
ND_UINT_KERNELS(16)
ND_UINT_KERNELS(32)
ND_UINT_KERNELS(64)

#if ND_FLOAT_KERNELS
/* ---- float32 / float64 (and complex SUM, componentwise) ---- */
#define ND_FMUL(x, y) ((x) * (y))
/* "|", not "||": no branch, so the loop vectorizes (compare, or, blend) */
#define ND_FMIN(x, y) ((((x) != (x)) | ((x) < (y))) ? (x) : (y))
#define ND_FMAX(x, y) ((((x) != (x)) | ((x) > (y))) ? (x) : (y))
ND_LOOP(nd_f32_add, nd_f32, ND_ADD)
ND_LOOP(nd_f32_mul, nd_f32, ND_FMUL)
ND_LOOP(nd_f32_min, nd_f32, ND_FMIN)
ND_LOOP(nd_f32_max, nd_f32, ND_FMAX)
ND_LOOP(nd_f64_add, nd_f64, ND_ADD)
ND_LOOP(nd_f64_mul, nd_f64, ND_FMUL)
ND_LOOP(nd_f64_min, nd_f64, ND_FMIN)
ND_LOOP(nd_f64_max, nd_f64, ND_FMAX)

static inline float nd_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t nd_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* ---- float16 ----
   Conversions without branches, so that the loops vectorize. Selects between
   float results are masks, not "?:": with -ftrapping-math (the default) GCC keeps
   a float operation that only one arm of a "?:" uses inside a branch, and a loop
   with a branch does not vectorize. */

/* c ? x : y, for c in {0, 1}, both computed */
static inline uint32_t nd_pick(uint32_t c, uint32_t x, uint32_t y)
{
    uint32_t m = 0u - c;
    return (x & m) | (y & ~m);
}

/* exact; a NaN keeps its payload (signalling ones too) */
static inline float nd_h2f(uint16_t h)
{
    uint32_t o = (uint32_t)(h & 0x7fffu) << 13; /* exponent and mantissa in place */
    uint32_t e = o & 0x0f800000u;
    o += 0x38000000u;                              /* rebias: (127 - 15) << 23 */
    o += e == 0x0f800000u ? 0x38000000u : 0u;      /* inf / NaN: exponent all ones */
    /* zero / subnormal: (1 + m/1024) * 2^-14 - 2^-14 = m * 2^-24, exact */
    float sub = nd_bits_f32(o + 0x00800000u) - 0x1p-14f;
    o = nd_pick(e == 0, nd_f32_bits(sub), o);
    return nd_bits_f32(o | ((uint32_t)(h & 0x8000u) << 16));
}

/* round to nearest even, overflow to inf, NaN keeps the top of its payload (the
   rules of NumPy's npy_floatbits_to_halfbits and of F16C's vcvtps2ph alike). f is
   always the result of an operation, so a NaN is quiet: its quiet bit lands in
   bit 9 and keeps the half a NaN. */
static inline uint16_t nd_f2h(float f)
{
    uint32_t u = nd_f32_bits(f), x = u & 0x7fffffffu;
    uint32_t nan = 0x7c00u | ((x & 0x7fffffu) >> 13);
    uint32_t big = x > 0x7f800000u ? nan : 0x7c00u; /* >= 65536: inf, or NaN */
    /* below 2^-14: adding 0.5 leaves units of 2^-24 in the mantissa, rounded to
       nearest even by the addition itself */
    uint32_t sub = nd_f32_bits(nd_bits_f32(x) + 0.5f) - 0x3f000000u;
    /* normal: rebias, add just under half a unit plus the unit's parity bit (ties to
       even); a carry out of the mantissa rounds up to the next binade or to inf */
    uint32_t nor = (x - 0x38000000u + 0xfffu + ((x >> 13) & 1u)) >> 13;
    uint32_t h = nd_pick(x >= 0x47800000u, big, nd_pick(x < 0x38800000u, sub, nor));
    return (uint16_t)(h | ((u >> 16) & 0x8000u));
}

#define ND_HNAN(h) (((h) & 0x7fffu) > 0x7c00u)
/* float op, rounded back; a NaN second operand comes out quieted as it is. Both
   sides are computed, then one is selected: no branch to vectorize around. */
static inline uint16_t nd_hadd(uint16_t x, uint16_t y)
{
    uint16_t r = nd_f2h(nd_h2f(x) + nd_h2f(y)), q = (uint16_t)(y | 0x200u);
    return (uint16_t)nd_pick(ND_HNAN(y), q, r);
}
static inline uint16_t nd_hmul(uint16_t x, uint16_t y)
{
    uint16_t r = nd_f2h(nd_h2f(x) * nd_h2f(y)), q = (uint16_t)(y | 0x200u);
    return (uint16_t)nd_pick(ND_HNAN(y), q, r);
}
static inline uint16_t nd_hmin(uint16_t x, uint16_t y)
{
    int take_x = ND_HNAN(x) | (nd_h2f(x) <= nd_h2f(y));
    return take_x ? x : y;
}
static inline uint16_t nd_hmax(uint16_t x, uint16_t y)
{
    int take_x = ND_HNAN(x) | (nd_h2f(x) >= nd_h2f(y));
    return take_x ? x : y;
}
#define ND_HADD nd_hadd
#define ND_HMUL nd_hmul
#define ND_HMIN nd_hmin
#define ND_HMAX nd_hmax
ND_LOOP(nd_f16_add, nd_u16, ND_HADD)
ND_LOOP(nd_f16_mul, nd_u16, ND_HMUL)
ND_LOOP(nd_f16_min, nd_u16, ND_HMIN)
ND_LOOP(nd_f16_max, nd_u16, ND_HMAX)

/* ---- bfloat16 (ml_dtypes) ---- */
static inline float nd_bf2f(uint16_t h) { return nd_bits_f32((uint32_t)h << 16); }

/* round to nearest even (overflow carries into inf); NaN -> 0x7fc0 with its sign */
static inline uint16_t nd_f2bf(float f)
{
    uint32_t u = nd_f32_bits(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t nan = ((u >> 16) & 0x8000u) | 0x7fc0u;
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

#define ND_BFNAN(h) (((h) & 0x7fffu) > 0x7f80u)
static inline uint16_t nd_bfadd(uint16_t x, uint16_t y)
{
    uint16_t r = nd_f2bf(nd_bf2f(x) + nd_bf2f(y)), q = (uint16_t)((y & 0x8000u) | 0x7fc0u);
    return ND_BFNAN(y) ? q : r;
}
static inline uint16_t nd_bfmul(uint16_t x, uint16_t y)
{
    uint16_t r = nd_f2bf(nd_bf2f(x) * nd_bf2f(y)), q = (uint16_t)((y & 0x8000u) | 0x7fc0u);
    return ND_BFNAN(y) ? q : r;
}
#define ND_BFADD nd_bfadd
#define ND_BFMUL nd_bfmul
#define ND_BFMIN(x, y) ((ND_BFNAN(x) | (nd_bf2f(x) < nd_bf2f(y))) ? (x) : (y))
#define ND_BFMAX(x, y) ((ND_BFNAN(x) | (nd_bf2f(x) > nd_bf2f(y))) ? (x) : (y))
ND_LOOP(nd_bf16_add, nd_u16, ND_BFADD)
ND_LOOP(nd_bf16_mul, nd_u16, ND_BFMUL)
ND_LOOP(nd_bf16_min, nd_u16, ND_BFMIN)
ND_LOOP(nd_bf16_max, nd_u16, ND_BFMAX)
#endif /* ND_FLOAT_KERNELS */

/* The kernel for (dtype, op), with the element count scaled (complex SUM runs on
   the real and imaginary parts as 2 * count floats); NULL when not computed here. */
static nd_kernel nd_select(int dtype, int op, size_t *scale)
{
    *scale = 1;
    if (op == ND_AVG || op == ND_PREMUL_SUM) op = ND_SUM;
    switch (dtype) {
    case ND_BOOL:
        switch (op) {
        case ND_SUM: case ND_MAX: case ND_BOR: return nd_bool_or;
        case ND_PRODUCT: case ND_MIN: case ND_BAND: return nd_bool_and;
        case ND_BXOR: return nd_bool_xor;
        }
        return NULL;
#define ND_INT_CASE(CODE, S, W)                                                       \
    case CODE:                                                                        \
        switch (op) {                                                                 \
        case ND_SUM: return nd_u##W##_add;                                            \
        case ND_PRODUCT: return nd_u##W##_mul;                                        \
        case ND_MIN: return nd_##S##W##_min;                                          \
        case ND_MAX: return nd_##S##W##_max;                                          \
        case ND_BAND: return nd_u##W##_and;                                           \
        case ND_BOR: return nd_u##W##_or;                                             \
        case ND_BXOR: return nd_u##W##_xor;                                           \
        }                                                                             \
        return NULL;
    ND_INT_CASE(ND_INT8, i, 8)
    ND_INT_CASE(ND_UINT8, u, 8)
    ND_INT_CASE(ND_INT16, i, 16)
    ND_INT_CASE(ND_UINT16, u, 16)
    ND_INT_CASE(ND_INT32, i, 32)
    ND_INT_CASE(ND_UINT32, u, 32)
    ND_INT_CASE(ND_INT64, i, 64)
    ND_INT_CASE(ND_UINT64, u, 64)
#undef ND_INT_CASE
#if ND_FLOAT_KERNELS
#define ND_FLOAT_CASE(CODE, P)                                                        \
    case CODE:                                                                        \
        switch (op) {                                                                 \
        case ND_SUM: return nd_##P##_add;                                             \
        case ND_PRODUCT: return nd_##P##_mul;                                         \
        case ND_MIN: return nd_##P##_min;                                             \
        case ND_MAX: return nd_##P##_max;                                             \
        }                                                                             \
        return NULL;
    ND_FLOAT_CASE(ND_FLOAT16, f16)
    ND_FLOAT_CASE(ND_FLOAT32, f32)
    ND_FLOAT_CASE(ND_FLOAT64, f64)
    ND_FLOAT_CASE(ND_BFLOAT16, bf16)
#undef ND_FLOAT_CASE
    case ND_COMPLEX64:
        *scale = 2;
        return op == ND_SUM ? nd_f32_add : NULL;
    case ND_COMPLEX128:
        *scale = 2;
        return op == ND_SUM ? nd_f64_add : NULL;
#endif
    }
    return NULL;
}

static int nd_reduce(void *dst, const void *a, const void *b, size_t count, int dtype, int op)
{
    size_t scale;
    nd_kernel k = nd_select(dtype, op, &scale);
    if (k == NULL) return -1;
    k(dst, a, b, count * scale);
    return 0;
}

#endif /* NDIST_NATIVE_KERNELS_H */

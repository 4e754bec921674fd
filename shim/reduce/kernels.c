// Reduction kernels in C so that gcc vectorizes them (Go does not); one cgo
// call covers a whole segment, so the call cost is noise.
#pragma GCC optimize("O3")
#include <string.h>
#include <math.h>
#include "kernels.h"

enum { I32 = 2, I64 = 4, F16 = 6, F32 = 7, F64 = 8, BF16 = 9 };

/* On x86-64 the loops are also compiled for AVX2 and picked at load time
 * (an ifunc): SSE2 lacks the 16-to-32-bit widening and narrowing that the
 * half-precision loops need. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

static inline uint32_t f2u(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float u2f(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float bf16_to_f32(uint16_t h) { return u2f((uint32_t)h << 16); }

/* Round to nearest even, NaN stays a quiet NaN: what torch does. */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = f2u(f);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet = (u >> 16) | 0x40;
    /* a select, not a branch, so that gcc vectorizes the loops */
    return (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet : rounded);
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0) {
        float f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
        return u2f(f2u(f) | sign);
    }
    if (exp == 31) return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round to nearest even (fp16_ieee_from_fp32_value of Maratyszcza/FP16). */
static inline uint16_t f32_to_f16(float f) {
    float base = (fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
    uint32_t w = f2u(f), shl1_w = w + w, sign = w & 0x80000000u;
    uint32_t bias = shl1_w & 0xff000000u;
    if (bias < 0x71000000u) bias = 0x71000000u;
    base = u2f((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f2u(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    return (uint16_t)((sign >> 16) | (shl1_w > 0xff000000u ? 0x7e00u : nonsign));
}

MULTIVERSION void ddpr_add(int dtype, void *dst, const void *a, const void *b, size_t n) {
    size_t i;
    switch (dtype) {
    case F32: {
        float *d = dst; const float *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case F64: {
        double *d = dst; const double *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case I32: { /* unsigned: overflow wraps instead of being undefined */
        uint32_t *d = dst; const uint32_t *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case I64: {
        uint64_t *d = dst; const uint64_t *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = x[i] + y[i];
        break;
    }
    case F16: {
        uint16_t *d = dst; const uint16_t *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = f32_to_f16(f16_to_f32(x[i]) + f16_to_f32(y[i]));
        break;
    }
    case BF16: {
        uint16_t *d = dst; const uint16_t *x = a, *y = b;
        for (i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(x[i]) + bf16_to_f32(y[i]));
        break;
    }
    }
}

MULTIVERSION void ddpr_div(int dtype, void *buf, size_t n, int64_t div) {
    size_t i;
    switch (dtype) {
    case F32: {
        float *d = buf, q = (float)div;
        for (i = 0; i < n; i++) d[i] = d[i] / q;
        break;
    }
    case F64: {
        double *d = buf, q = (double)div;
        for (i = 0; i < n; i++) d[i] = d[i] / q;
        break;
    }
    case I32: {
        int32_t *d = buf, q = (int32_t)div;
        for (i = 0; i < n; i++) d[i] = d[i] / q;
        break;
    }
    case I64: {
        int64_t *d = buf;
        for (i = 0; i < n; i++) d[i] = d[i] / div;
        break;
    }
    case F16: {
        uint16_t *d = buf; float q = (float)div;
        for (i = 0; i < n; i++) d[i] = f32_to_f16(f16_to_f32(d[i]) / q);
        break;
    }
    case BF16: {
        uint16_t *d = buf; float q = (float)div;
        for (i = 0; i < n; i++) d[i] = f32_to_bf16(bf16_to_f32(d[i]) / q);
        break;
    }
    }
}

void ddpr_encode(int dtype, void *dst, const double *src, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        switch (dtype) {
        case F32: ((float *)dst)[i] = (float)src[i]; break;
        case F64: ((double *)dst)[i] = src[i]; break;
        case I32: ((int32_t *)dst)[i] = (int32_t)src[i]; break;
        case I64: ((int64_t *)dst)[i] = (int64_t)src[i]; break;
        case F16: ((uint16_t *)dst)[i] = f32_to_f16((float)src[i]); break;
        case BF16: ((uint16_t *)dst)[i] = f32_to_bf16((float)src[i]); break;
        }
    }
}

void ddpr_decode(int dtype, double *dst, const void *src, size_t n) {
    size_t i;
    for (i = 0; i < n; i++) {
        switch (dtype) {
        case F32: dst[i] = ((const float *)src)[i]; break;
        case F64: dst[i] = ((const double *)src)[i]; break;
        case I32: dst[i] = ((const int32_t *)src)[i]; break;
        case I64: dst[i] = (double)((const int64_t *)src)[i]; break;
        case F16: dst[i] = f16_to_f32(((const uint16_t *)src)[i]); break;
        case BF16: dst[i] = bf16_to_f32(((const uint16_t *)src)[i]); break;
        }
    }
}

#ifndef DDPSHIM_REDUCE_KERNELS_H
#define DDPSHIM_REDUCE_KERNELS_H
#include <stddef.h>
#include <stdint.h>

/* dtype values are ncclDataType_t's, as in ddpshim.h. */
void ddpr_add(int dtype, void *dst, const void *a, const void *b, size_t n);
void ddpr_div(int dtype, void *buf, size_t n, int64_t d);
void ddpr_encode(int dtype, void *dst, const double *src, size_t n);
void ddpr_decode(int dtype, double *dst, const void *src, size_t n);
#endif

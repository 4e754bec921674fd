/* Stub for the layout check: what nccl.h needs from CUDA (no CUDA toolkit
 * is installed for CI): size_t, the opaque stream and event handles, and
 * CUDART_VERSION. */
#ifndef LAYOUT_CUDA_RUNTIME_H
#define LAYOUT_CUDA_RUNTIME_H
#include <stddef.h>
#define CUDART_VERSION 12000
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
#endif

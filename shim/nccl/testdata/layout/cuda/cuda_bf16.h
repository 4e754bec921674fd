/* Stub for the layout check: nccl.h declares ncclBfloat16 only when CUDA's
 * bf16 header says the type exists. */
#define __CUDA_BF16_TYPES_EXIST__

/* nccl_side.c: the layout table from a real nccl.h (compiled against the
 * CUDA stubs in cuda/), and the shim's function table checked against the
 * real prototypes. funcs.h is written by layout_test.go: the ddpnccl_lib
 * typedef copied from ddpnccl.h, and one LAYOUT_FUNC(field, ncclName) per
 * entry of ddpnccl.c's symbol table. */
#include <limits.h>
#include <nccl.h>

#include "layout.h"

/* Values a header may predate: main.c prints "absent", and layout_test.go
 * accepts it only from a header older than the release that added them. */
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 30, 0)
#define ncclTimeout LAYOUT_ABSENT
#endif
#ifndef NCCL_API_MAGIC /* before 2.29 only NCCL_CONFIG_INITIALIZER's literal 0xcafebeef */
#define NCCL_API_MAGIC LAYOUT_ABSENT
#endif

static const ncclConfig_t nccl_init = NCCL_CONFIG_INITIALIZER;

#define LAYOUT_VERSION NCCL_VERSION
#define LAYOUT_INIT nccl_init

LAYOUT_TABLE_FUNC(nccl_table)
const long long nccl_config_size = sizeof(ncclConfig_t);
const int nccl_major = NCCL_MAJOR, nccl_minor = NCCL_MINOR, nccl_patch = NCCL_PATCH;
const long long nccl_version_code = NCCL_VERSION_CODE;

long long nccl_version(int major, int minor, int patch) { return NCCL_VERSION(major, minor, patch); }

#include "funcs.h"

int nccl_funcs(struct layout_entry *out, int max) {
  int n = 0;
#define LAYOUT_FUNC(field, fn)                                                                             \
  if (n < max)                                                                                             \
    out[n++] = (struct layout_entry){                                                                      \
        #fn, __builtin_types_compatible_p(__typeof__(((ddpnccl_lib *)0)->field), __typeof__(&fn)), ""};
  LAYOUT_FUNCS
#undef LAYOUT_FUNC
  return n;
}

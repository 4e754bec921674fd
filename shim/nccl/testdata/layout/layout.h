/*
 * layout.h: what the layout check compares between the shim's own NCCL
 * declarations (ddpnccl.h, in shim_side.c) and a real nccl.h (in
 * nccl_side.c). Both translation units expand the same lists, so their
 * tables line up entry by entry; main.c prints them side by side and
 * shim/nccl/layout_test.go judges them.
 */
#ifndef LAYOUT_H
#define LAYOUT_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* LAYOUT_ABSENT stands for a value the header does not declare. */
#define LAYOUT_ABSENT LLONG_MIN

/* One compared item: a value, and for struct fields the field's C type. */
struct layout_entry {
  const char *name;
  long long value;
  const char *type; /* "" when not a field */
};

/* Every ncclConfig_t field the shim declares, in order. */
#define LAYOUT_CONFIG_FIELDS(F) \
  F(size) F(magic) F(version) F(blocking) F(cgaClusterSize) F(minCTAs) F(maxCTAs) F(netName) F(splitShare)

/* Fields NCCL_CONFIG_INITIALIZER and ddpnccl_config_init must agree on
 * (size, version and blocking differ by design). */
#define LAYOUT_INIT_FIELDS(F) F(magic) F(cgaClusterSize) F(minCTAs) F(maxCTAs) F(netName) F(splitShare)

/* Enum values and macros the shim uses. */
#define LAYOUT_VALUES(V)                                                                                    \
  V(ncclSuccess) V(ncclUnhandledCudaError) V(ncclSystemError) V(ncclInternalError) V(ncclInvalidArgument) \
  V(ncclInvalidUsage) V(ncclRemoteError) V(ncclInProgress) V(ncclTimeout)                                 \
  V(ncclInt8) V(ncclUint8) V(ncclInt32) V(ncclUint32) V(ncclInt64) V(ncclUint64) V(ncclFloat16)           \
  V(ncclFloat32) V(ncclFloat64) V(ncclBfloat16)                                                           \
  V(ncclSum) V(ncclProd) V(ncclMax) V(ncclMin) V(ncclAvg)                                                 \
  V(NCCL_UNIQUE_ID_BYTES) V(NCCL_API_MAGIC) V(NCCL_CONFIG_UNDEF_INT)

/* Versions the version macro is compared at (besides the header's own):
 * both sides of the 2.8/2.9 change of formula, and the releases since. */
#define LAYOUT_VERSIONS(W) \
  W(2, 4, 8) W(2, 8, 4) W(2, 9, 0) W(2, 9, 9) W(2, 10, 3) W(2, 18, 0) W(2, 18, 3) W(2, 27, 7) W(2, 32, 3) W(3, 0, 0) W(3, 1, 2)

#define LAYOUT_TYPENAME(e)                                                                                 \
  _Generic((e), size_t: "size_t", unsigned int: "unsigned int", int: "int", const char *: "const char *", \
           default: "other")

#define LAYOUT_FIELD_ENTRIES(f)                                                                      \
  {"offsetof(ncclConfig_t, " #f ")", (long long)offsetof(ncclConfig_t, f),                          \
   LAYOUT_TYPENAME(((ncclConfig_t *)0)->f)},                                                         \
      {"sizeof(ncclConfig_t." #f ")", (long long)sizeof(((ncclConfig_t *)0)->f), ""},
#define LAYOUT_VALUE_ENTRY(v) {#v, (long long)(v), ""},
#define LAYOUT_VERSION_ENTRY(x, y, z) {"NCCL_VERSION(" #x ", " #y ", " #z ")", (long long)LAYOUT_VERSION(x, y, z), ""},
#define LAYOUT_INIT_ENTRY(f) {"NCCL_CONFIG_INITIALIZER." #f, (long long)(intptr_t)LAYOUT_INIT.f, ""},

/* The common table: each side defines LAYOUT_VERSION and LAYOUT_INIT (an
 * ncclConfig_t as that side initializes it) before expanding it. */
#define LAYOUT_TABLE                                                                                        \
  {"sizeof(ncclUniqueId)", (long long)sizeof(ncclUniqueId), ""},                                            \
      {"sizeof(ncclResult_t)", (long long)sizeof(ncclResult_t), ""},                                        \
      {"sizeof(ncclDataType_t)", (long long)sizeof(ncclDataType_t), ""},                                    \
      {"sizeof(ncclRedOp_t)", (long long)sizeof(ncclRedOp_t), ""},                                          \
      {"sizeof(ncclComm_t)", (long long)sizeof(ncclComm_t), ""},                                            \
      {"_Alignof(ncclConfig_t)", (long long)_Alignof(ncclConfig_t), ""},                                    \
      {"NCCL_CONFIG_UNDEF_PTR", (long long)(intptr_t)NCCL_CONFIG_UNDEF_PTR, ""},                            \
      LAYOUT_CONFIG_FIELDS(LAYOUT_FIELD_ENTRIES) LAYOUT_VALUES(LAYOUT_VALUE_ENTRY)                          \
      LAYOUT_VERSIONS(LAYOUT_VERSION_ENTRY) LAYOUT_INIT_FIELDS(LAYOUT_INIT_ENTRY)

/* LAYOUT_TABLE_FUNC defines NAME(out, max), which fills out with the
 * table (at run time: LAYOUT_INIT may call a function) and returns its
 * length. */
#define LAYOUT_TABLE_FUNC(name)                          \
  int name(struct layout_entry *out, int max) {          \
    const struct layout_entry t[] = {LAYOUT_TABLE};      \
    int n = (int)(sizeof t / sizeof t[0]);               \
    for (int i = 0; i < n && i < max; i++) out[i] = t[i]; \
    return n;                                            \
  }

/* shim_side.c */
int shim_table(struct layout_entry *out, int max);
extern const long long shim_config_size;                /* sizeof(ncclConfig_t) */
extern const long long shim_config_version;             /* DDPNCCL_CONFIG_VERSION */
long long shim_version(int major, int minor, int patch); /* DDPNCCL_VERSION */

/* nccl_side.c */
int nccl_table(struct layout_entry *out, int max);
extern const long long nccl_config_size; /* sizeof(ncclConfig_t) */
extern const int nccl_major, nccl_minor, nccl_patch;
extern const long long nccl_version_code; /* NCCL_VERSION_CODE */
long long nccl_version(int major, int minor, int patch);
/* nccl_funcs fills one entry per function of ddpnccl_lib: 1 when the
 * shim's pointer type is the real prototype's, named by NCCL's function. */
int nccl_funcs(struct layout_entry *out, int max);

#endif

/*
 * ddpnccl.h: NCCL resolved at run time, for package nccl (and, later, the
 * shim's C hot path). Nothing here links against NCCL or CUDA: the types are
 * declared by hand, the functions come from dlsym into a table.
 *
 * Types and values as NVIDIA/nccl src/nccl.h.in declares them (read at
 * commit 021e8045ff77; the config struct also as 2.14 declared
 * ncclConfig_v21400 and 2.17/2.18 ncclConfig_v21700), config parsing as
 * src/init.cc's parseCommConfig does it (read at commit 00ad458b155a; 2.14
 * did the same size/magic handling inside ncclCommInitRankConfig).
 *
 * No symbol defined here may be named nccl*: dlsym(RTLD_DEFAULT,
 * "ncclGetVersion") must never find this library. Every function is hidden,
 * so libddpshim.so exports only the functions of ddpshim.h.
 */
#ifndef DDPNCCL_H
#define DDPNCCL_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define DDPNCCL_HIDDEN __attribute__((visibility("hidden")))

/* Opaque handles. cudaStream_t is CUDA's `struct CUstream_st *`. */
typedef struct ncclComm *ncclComm_t;
typedef struct CUstream_st *cudaStream_t;

#define NCCL_UNIQUE_ID_BYTES 128
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

/* ncclResult_t. ncclRemoteError arrived in 2.13 (with ncclGetLastError),
 * ncclInProgress in 2.14 (non-blocking communicators), ncclTimeout later;
 * ncclNumResults moves with them and is not declared here. */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8
} ncclResult_t;

/* ncclDataType_t. ncclBfloat16 exists from 2.10 (on CUDA >= 11 builds). */
typedef enum {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclBfloat16 = 9
} ncclDataType_t;

/* ncclRedOp_t. ncclAvg exists from 2.10. */
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4
} ncclRedOp_t;

/* NCCL_VERSION as nccl.h defines it: X*1000+Y*100+Z up to 2.8, then
 * X*10000+Y*100+Z (2.9.0 is 20900). */
#define DDPNCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))

#define NCCL_CONFIG_UNDEF_INT INT_MIN
#define NCCL_CONFIG_UNDEF_PTR NULL
#define NCCL_API_MAGIC 0xcafebeef

/*
 * ncclConfig_t: the first fields of NCCL's struct, as of 2.18 (2.14 had
 * size..blocking, 2.17 added cgaClusterSize..netName, 2.18 splitShare; later
 * releases only append). config.version says which release the caller
 * declared against: DDPNCCL_CONFIG_VERSION.
 *
 * Why NCCL accepts a struct smaller (or larger) than its own: from 2.14 on,
 * ncclCommInitRankConfig (src/init.cc, parseCommConfig in 2.17+) starts from
 * a copy filled by its own NCCL_CONFIG_INITIALIZER, reads config->size, and
 * copies min(config->size, sizeof(its ncclConfig_t)) bytes over it; fields
 * beyond our size keep NCCL's defaults. It then requires magic ==
 * NCCL_API_MAGIC (else ncclInvalidArgument, "ncclConfig_t argument not
 * initialized via NCCL_CONFIG_INITIALIZER"), and resets to defaults every
 * field newer than config->version (e.g. version < NCCL_VERSION(2,17,0)
 * resets cgaClusterSize, minCTAs, maxCTAs, netName). A release older than
 * our declaration (2.14..2.17) copies only its own, smaller, size. 2.14
 * rejects a blocking other than 0 or 1, so blocking is always set.
 *
 * The copy includes our trailing padding (sizeof is 48 on LP64, splitShare
 * ends at 44), which lands on trafficClass (new in 2.26, as the layout
 * test's headers show); the version check resets that field, and
 * ddpnccl_config_init zeroes the padding. Declaring more
 * fields means raising DDPNCCL_CONFIG_VERSION to the release that has them.
 */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
  int cgaClusterSize;
  int minCTAs;
  int maxCTAs;
  const char *netName;
  int splitShare;
} ncclConfig_t;

#define DDPNCCL_CONFIG_VERSION DDPNCCL_VERSION(2, 18, 0)

/* ddpnccl_lib is one resolved NCCL: the dlopen handle (NULL when the
 * symbols came from the process) and the function table. Optional entries
 * are NULL when the symbol is missing; the Go side gates them by version
 * too. */
typedef struct {
  void *handle;
  /* required */
  ncclResult_t (*getVersion)(int *version);
  ncclResult_t (*getUniqueId)(ncclUniqueId *uniqueId);
  ncclResult_t (*commInitRank)(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
  ncclResult_t (*allReduce)(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
  ncclResult_t (*commAbort)(ncclComm_t comm);
  ncclResult_t (*commDestroy)(ncclComm_t comm);
  const char *(*getErrorString)(ncclResult_t result);
  ncclResult_t (*commGetAsyncError)(ncclComm_t comm, ncclResult_t *asyncError);
  /* optional */
  ncclResult_t (*commInitRankConfig)(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t *config);
  ncclResult_t (*commFinalize)(ncclComm_t comm);
  const char *(*getLastError)(ncclComm_t comm);
} ddpnccl_lib;

/* Why a wait loop returned. */
#define DDPNCCL_DONE 0     /* the state left ncclInProgress (or the poll itself failed) */
#define DDPNCCL_DEADLINE 1 /* timeout_ns passed while still ncclInProgress */
#define DDPNCCL_STOPPED 2  /* *stop became non-zero: the caller is aborting */

/* ddpnccl_open fills lib from path: NULL means the symbols already in the
 * process (dlsym(RTLD_DEFAULT, ...)), else dlopen(path, RTLD_NOW|RTLD_LOCAL).
 * Returns 0, or -1 with a NUL-terminated reason (dlerror's text, or the
 * missing symbol) in err; a library opened here that lacks a symbol is
 * closed again. */
DDPNCCL_HIDDEN int ddpnccl_open(ddpnccl_lib *lib, const char *path, char *err, size_t errlen);

DDPNCCL_HIDDEN ncclResult_t ddpnccl_get_version(const ddpnccl_lib *lib, int *version);
DDPNCCL_HIDDEN ncclResult_t ddpnccl_get_unique_id(const ddpnccl_lib *lib, ncclUniqueId *id);
DDPNCCL_HIDDEN const char *ddpnccl_error_string(const ddpnccl_lib *lib, ncclResult_t r);
/* ddpnccl_last_error returns ncclGetLastError(NULL), or "" without it. The
 * comm argument is unused by NCCL (its docs for 2.16-2.18 say it may be
 * NULL); NULL keeps a freed comm out of the call. */
DDPNCCL_HIDDEN const char *ddpnccl_last_error(const ddpnccl_lib *lib);

/* ddpnccl_config_init fills cfg like NCCL_CONFIG_INITIALIZER for our
 * declaration, with the given blocking. */
DDPNCCL_HIDDEN void ddpnccl_config_init(ncclConfig_t *cfg, int blocking);

/* ddpnccl_init_blocking calls ncclCommInitRank; it blocks until every rank
 * has joined or NCCL's bootstrap gives up. */
DDPNCCL_HIDDEN ncclResult_t ddpnccl_init_blocking(const ddpnccl_lib *lib, ncclComm_t *comm, int nranks,
                                                  const ncclUniqueId *id, int rank);

/* ddpnccl_init_nonblocking calls ncclCommInitRankConfig with blocking=0 and,
 * while NCCL says ncclInProgress, polls ncclCommGetAsyncError until timeout_ns
 * or *stop. *comm is set whenever NCCL set it, also on failure: the caller
 * aborts it. */
DDPNCCL_HIDDEN ncclResult_t ddpnccl_init_nonblocking(const ddpnccl_lib *lib, ncclComm_t *comm, int nranks,
                                                     const ncclUniqueId *id, int rank, int64_t timeout_ns,
                                                     const int32_t *stop, int *why);

/* ddpnccl_allreduce issues an in-place ncclAllReduce (sendbuff == recvbuff).
 * With nonblocking, an ncclInProgress return is polled to the end as in
 * ddpnccl_init_nonblocking. Without, a successful call is followed by one
 * ncclCommGetAsyncError, so an asynchronous failure surfaces at once. */
DDPNCCL_HIDDEN ncclResult_t ddpnccl_allreduce(const ddpnccl_lib *lib, void *buf, size_t count, int dtype, int op,
                                              ncclComm_t comm, void *stream, int nonblocking, int64_t timeout_ns,
                                              const int32_t *stop, int *why);

/* ddpnccl_async_error returns ncclCommGetAsyncError's state (or its own
 * failure). */
DDPNCCL_HIDDEN ncclResult_t ddpnccl_async_error(const ddpnccl_lib *lib, ncclComm_t comm);

/* ddpnccl_finalize calls ncclCommFinalize and polls while ncclInProgress, as
 * ddpnccl_init_nonblocking. */
DDPNCCL_HIDDEN ncclResult_t ddpnccl_finalize(const ddpnccl_lib *lib, ncclComm_t comm, int64_t timeout_ns,
                                             const int32_t *stop, int *why);

DDPNCCL_HIDDEN ncclResult_t ddpnccl_destroy(const ddpnccl_lib *lib, ncclComm_t comm);
DDPNCCL_HIDDEN ncclResult_t ddpnccl_abort(const ddpnccl_lib *lib, ncclComm_t comm);

#endif

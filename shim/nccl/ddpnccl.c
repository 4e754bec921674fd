// ddpnccl.c: the NCCL calls of package nccl. See ddpnccl.h.
#define _GNU_SOURCE
#include "ddpnccl.h"

#include <dlfcn.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

struct sym {
  const char *name;
  size_t offset;
  int required;
};

#define SYM(field, name, req) {name, offsetof(ddpnccl_lib, field), req}

static const struct sym syms[] = {
    SYM(getVersion, "ncclGetVersion", 1),
    SYM(getUniqueId, "ncclGetUniqueId", 1),
    SYM(commInitRank, "ncclCommInitRank", 1),
    SYM(allReduce, "ncclAllReduce", 1),
    SYM(commAbort, "ncclCommAbort", 1),
    SYM(commDestroy, "ncclCommDestroy", 1),
    SYM(getErrorString, "ncclGetErrorString", 1),
    SYM(commGetAsyncError, "ncclCommGetAsyncError", 1),
    SYM(commInitRankConfig, "ncclCommInitRankConfig", 0),
    SYM(commFinalize, "ncclCommFinalize", 0),
    SYM(getLastError, "ncclGetLastError", 0),
};

int ddpnccl_open(ddpnccl_lib *lib, const char *path, char *err, size_t errlen) {
  memset(lib, 0, sizeof *lib);
  void *h = RTLD_DEFAULT;
  dlerror();
  if (path != NULL) {
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      const char *e = dlerror();
      snprintf(err, errlen, "%s", e ? e : "dlopen failed");
      return -1;
    }
    lib->handle = h;
  }
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    dlerror();
    void *p = dlsym(h, syms[i].name);
    if (p == NULL && syms[i].required) {
      const char *e = dlerror();
      snprintf(err, errlen, "%s not found (%s)", syms[i].name, e ? e : "NULL");
      if (lib->handle != NULL) dlclose(lib->handle);
      memset(lib, 0, sizeof *lib);
      return -1;
    }
    memcpy((char *)lib + syms[i].offset, &p, sizeof p);
  }
  return 0;
}

ncclResult_t ddpnccl_get_version(const ddpnccl_lib *lib, int *version) { return lib->getVersion(version); }

ncclResult_t ddpnccl_get_unique_id(const ddpnccl_lib *lib, ncclUniqueId *id) { return lib->getUniqueId(id); }

const char *ddpnccl_error_string(const ddpnccl_lib *lib, ncclResult_t r) {
  const char *s = lib->getErrorString(r);
  return s ? s : "";
}

const char *ddpnccl_last_error(const ddpnccl_lib *lib) {
  if (lib->getLastError == NULL) return "";
  const char *s = lib->getLastError(NULL);
  return s ? s : "";
}

void ddpnccl_config_init(ncclConfig_t *cfg, int blocking) {
  /* Zero first: NCCL copies config->size bytes, trailing padding included,
   * and from 2.25 its trafficClass sits where our padding is (NCCL resets
   * it to its default because our version is older; zeros keep it
   * deterministic regardless). */
  memset(cfg, 0, sizeof *cfg);
  cfg->size = sizeof(ncclConfig_t);
  cfg->magic = NCCL_API_MAGIC;
  cfg->version = DDPNCCL_CONFIG_VERSION;
  cfg->blocking = blocking;
  cfg->cgaClusterSize = NCCL_CONFIG_UNDEF_INT;
  cfg->minCTAs = NCCL_CONFIG_UNDEF_INT;
  cfg->maxCTAs = NCCL_CONFIG_UNDEF_INT;
  cfg->netName = NCCL_CONFIG_UNDEF_PTR;
  cfg->splitShare = NCCL_CONFIG_UNDEF_INT;
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* poll waits for comm to leave ncclInProgress. ncclCommGetAsyncError is an
 * atomic load in NCCL, so the first polls spin (the usual enqueue takes
 * microseconds); later ones sleep, up to 1 ms, which bounds how long an
 * aborting caller waits for this loop to notice *stop. */
static ncclResult_t poll(const ddpnccl_lib *lib, ncclComm_t comm, int64_t timeout_ns, const int32_t *stop,
                         int *why) {
  int64_t deadline = now_ns() + timeout_ns;
  long sleep_ns = 10000;
  for (int i = 0;; i++) {
    if (stop != NULL && __atomic_load_n(stop, __ATOMIC_ACQUIRE)) {
      *why = DDPNCCL_STOPPED;
      return ncclInProgress;
    }
    ncclResult_t state = ncclInProgress;
    ncclResult_t r = lib->commGetAsyncError(comm, &state);
    if (r != ncclSuccess) {
      *why = DDPNCCL_DONE;
      return r;
    }
    if (state != ncclInProgress) {
      *why = DDPNCCL_DONE;
      return state;
    }
    if (now_ns() >= deadline) {
      *why = DDPNCCL_DEADLINE;
      return ncclInProgress;
    }
    if (i < 100) {
      sched_yield();
      continue;
    }
    struct timespec ts = {0, sleep_ns};
    nanosleep(&ts, NULL);
    if (sleep_ns < 1000000) sleep_ns *= 2;
    if (sleep_ns > 1000000) sleep_ns = 1000000;
  }
}

ncclResult_t ddpnccl_init_blocking(const ddpnccl_lib *lib, ncclComm_t *comm, int nranks, const ncclUniqueId *id,
                                   int rank) {
  *comm = NULL;
  return lib->commInitRank(comm, nranks, *id, rank);
}

ncclResult_t ddpnccl_init_nonblocking(const ddpnccl_lib *lib, ncclComm_t *comm, int nranks, const ncclUniqueId *id,
                                      int rank, int64_t timeout_ns, const int32_t *stop, int *why) {
  ncclConfig_t cfg;
  ddpnccl_config_init(&cfg, 0);
  *comm = NULL;
  *why = DDPNCCL_DONE;
  ncclResult_t r = lib->commInitRankConfig(comm, nranks, *id, rank, &cfg);
  if (r == ncclInProgress && *comm != NULL) r = poll(lib, *comm, timeout_ns, stop, why);
  return r;
}

ncclResult_t ddpnccl_allreduce(const ddpnccl_lib *lib, void *buf, size_t count, int dtype, int op, ncclComm_t comm,
                               void *stream, int nonblocking, int64_t timeout_ns, const int32_t *stop, int *why) {
  *why = DDPNCCL_DONE;
  ncclResult_t r =
      lib->allReduce(buf, buf, count, (ncclDataType_t)dtype, (ncclRedOp_t)op, comm, (cudaStream_t)stream);
  if (nonblocking) {
    if (r == ncclInProgress) r = poll(lib, comm, timeout_ns, stop, why);
    return r;
  }
  if (r == ncclSuccess) {
    ncclResult_t state = ncclSuccess;
    if (lib->commGetAsyncError(comm, &state) == ncclSuccess && state != ncclSuccess && state != ncclInProgress)
      r = state;
  }
  return r;
}

ncclResult_t ddpnccl_async_error(const ddpnccl_lib *lib, ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  ncclResult_t r = lib->commGetAsyncError(comm, &state);
  return r != ncclSuccess ? r : state;
}

ncclResult_t ddpnccl_finalize(const ddpnccl_lib *lib, ncclComm_t comm, int64_t timeout_ns, const int32_t *stop,
                              int *why) {
  *why = DDPNCCL_DONE;
  ncclResult_t r = lib->commFinalize(comm);
  if (r == ncclInProgress) r = poll(lib, comm, timeout_ns, stop, why);
  return r;
}

ncclResult_t ddpnccl_destroy(const ddpnccl_lib *lib, ncclComm_t comm) { return lib->commDestroy(comm); }

ncclResult_t ddpnccl_abort(const ddpnccl_lib *lib, ncclComm_t comm) { return lib->commAbort(comm); }

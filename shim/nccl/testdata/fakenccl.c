/*
 * fakenccl.c: a fake libnccl.so.2 on host memory, for tests of the shim's
 * NCCL transport on machines without GPUs. Build:
 *
 *   gcc -shared -fPIC -O2 -pthread -o DIR/libnccl.so.2 shim/nccl/testdata/fakenccl.c
 *
 * (nccltest.Build does exactly this.) It implements the subset the shim
 * uses: ncclGetVersion, ncclGetUniqueId, ncclCommInitRank,
 * ncclCommInitRankConfig, ncclAllReduce (in place or not), ncclCommAbort,
 * ncclCommDestroy, ncclCommFinalize, ncclCommGetAsyncError,
 * ncclGetErrorString, ncclGetLastError. "Device" buffers are host memory;
 * the stream is ignored.
 *
 * Ranks are threads or processes. ncclGetUniqueId makes a directory
 * ($FAKE_NCCL_DIR, else $TMPDIR, else /tmp: fakenccl-XXXXXX) and the id holds
 * its path. Each rank writes a file there for init and for every collective
 * (header + its buffer), waits until all ranks' files exist, and reduces them
 * in rank order, so every rank computes identical bytes. Data types: int32,
 * int64, float16, float32, float64, bfloat16 (halves are summed in float and
 * rounded once); ops: sum and avg (integers truncate).
 *
 * Knobs, read from the environment at call time:
 *   FAKE_NCCL_VERSION=code   what ncclGetVersion reports (default 22005)
 *   FAKE_NCCL_INPROGRESS=k   non-blocking comms: init, every allreduce and
 *                            finalize report ncclInProgress at least k times
 *                            (the call's own return counts) before their
 *                            result; more while peers have not arrived
 *   FAKE_NCCL_FAIL=init      init fails with ncclSystemError
 *   FAKE_NCCL_FAIL=allreduce every allreduce sets the async error
 *                            ncclSystemError (the call itself succeeds on a
 *                            blocking comm)
 *   FAKE_NCCL_HANG=allreduce allreduce never completes until ncclCommAbort
 *   FAKE_NCCL_RECORD=path    append one line per event (init with the
 *                            ncclConfig_t as parsed, inprogress counts,
 *                            allreduce, finalize, destroy, abort)
 *
 * ncclCommAbort may be called from any thread: calls blocked in the
 * communicator return ncclInternalError, the background thread is joined,
 * and only then is the communicator freed.
 *
 * The same library is also a fake CUDA driver (libcuda.so.1: cuInit,
 * contexts, streams, timing events), so that the shim's watchdog, which
 * records events around each collective, runs here too: load it through
 * DDP_AGENT_CUDA_LIB as well, and both share one state. Streams are just
 * handles. Every allreduce enqueued on a stream keeps the stream busy for
 * FAKE_CUDA_KERNEL_MS (default 0) after the later of now and its previous
 * work; an event completes when the stream reaches it. More knobs:
 *   FAKE_NCCL_HANG=stream    allreduce returns ncclSuccess at once but its
 *                            "kernel" never ends: events recorded on the
 *                            stream after it stay pending until
 *                            ncclCommAbort, as with a peer that never joins
 *   FAKE_NCCL_FAIL=async     the same, and 50 ms later the communicator's
 *                            asynchronous error becomes ncclRemoteError,
 *                            as when a peer dies mid-collective
 *   FAKE_CUDA_FAIL=init      cuInit returns CUDA_ERROR_NO_DEVICE
 *   FAKE_CUDA_AUTOCTX=0      cuCtxGetCurrent makes no context current
 * Event and stream calls need cuInit and a current context; the first
 * cuCtxGetCurrent on a thread makes the primary context current there (as
 * the CUDA runtime has done on PyTorch's threads), other threads must call
 * cuCtxSetCurrent. fakeCudaLiveEvents() counts events not destroyed.
 *
 * Types and values as NVIDIA/nccl src/nccl.h.in; the error strings as
 * src/init.cc's ncclGetErrorString (2.19+). ncclConfig_t is declared as NCCL
 * 2.27 does, larger than the shim's, and parsed as parseCommConfig does
 * (copy min(size, sizeof) over the initializer, require the magic, reset
 * the fields newer than config->version); the record shows the result.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef struct ncclComm *ncclComm_t;
typedef void *cudaStream_t;
typedef struct { char internal[128]; } ncclUniqueId;
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
  ncclNumResults = 9
} ncclResult_t;
typedef enum { ncclInt32 = 2, ncclInt64 = 4, ncclFloat16 = 6, ncclFloat32 = 7, ncclFloat64 = 8, ncclBfloat16 = 9 } ncclDataType_t;
typedef enum { ncclSum = 0, ncclAvg = 4 } ncclRedOp_t;

#define NCCL_CONFIG_UNDEF_INT INT_MIN
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
  int trafficClass;
  const char *commName;
  int collnetEnable;
  int CTAPolicy;
  int shrinkShare;
  int nvlsCTAs;
} ncclConfig_t;

/* ---- last error (global, like NCCL's) and the record file ---- */

static pthread_mutex_t lastmu = PTHREAD_MUTEX_INITIALIZER;
static char lasterr[1024];

static void set_last(const char *fmt, ...) {
  pthread_mutex_lock(&lastmu);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(lasterr, sizeof lasterr, fmt, ap);
  va_end(ap);
  pthread_mutex_unlock(&lastmu);
}

static void record(const char *fmt, ...) {
  const char *path = getenv("FAKE_NCCL_RECORD");
  if (path == NULL || *path == 0) return;
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if (n > (int)sizeof line - 2) n = sizeof line - 2;
  line[n++] = '\n';
  int fd = open(path, O_WRONLY | O_APPEND | O_CREAT, 0644);
  if (fd < 0) return;
  ssize_t w = write(fd, line, n);
  (void)w;
  close(fd);
}

static int env_is(const char *name, const char *value) {
  const char *v = getenv(name);
  return v != NULL && strcmp(v, value) == 0;
}

static int env_int(const char *name, int def) {
  const char *v = getenv(name);
  return v != NULL && *v ? atoi(v) : def;
}

/* ---- the communicator ---- */

enum { OP_NONE, OP_INIT, OP_ALLREDUCE, OP_FINALIZE };
static const char *opnames[] = {"none", "init", "allreduce", "finalize"};

struct ncclComm {
  int rank, nranks, blocking;
  char dir[128];
  long seq; /* collectives issued */
  int aborted;
  int busy; /* API calls inside this comm */
  pthread_mutex_t mu;
  ncclResult_t async; /* ncclSuccess, ncclInProgress or a sticky error */
  struct timespec fail_at; /* FAKE_NCCL_FAIL=async: when async turns to ncclRemoteError */
  /* the non-blocking operation under way */
  int op, want, reports, done;
  ncclResult_t result;
  pthread_t thread;
  int has_thread;
  const void *send;
  void *recv;
  size_t count;
  int dtype, redop;
  long opseq;
};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  nanosleep(&ts, NULL);
}

static int is_aborted(ncclComm_t c) { return __atomic_load_n(&c->aborted, __ATOMIC_ACQUIRE); }
static void enter(ncclComm_t c) { __atomic_add_fetch(&c->busy, 1, __ATOMIC_ACQ_REL); }
static void leave(ncclComm_t c) { __atomic_sub_fetch(&c->busy, 1, __ATOMIC_ACQ_REL); }

static int file_exists(const char *path) {
  struct stat st;
  return stat(path, &st) == 0;
}

/* write_file writes atomically (tmp + rename), so a reader sees all or nothing. */
static int write_file(const char *path, const void *a, size_t na, const void *b, size_t nb) {
  char tmp[300];
  snprintf(tmp, sizeof tmp, "%s.tmp", path);
  FILE *f = fopen(tmp, "wb");
  if (f == NULL) return -1;
  int ok = fwrite(a, 1, na, f) == na && (nb == 0 || fwrite(b, 1, nb, f) == nb);
  ok = fclose(f) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) return -1;
  return 0;
}

/* wait_all waits until dir/<prefix>.<r> exists for every rank, or abort. */
static ncclResult_t wait_all(ncclComm_t c, const char *prefix) {
  char path[300];
  for (int r = 0; r < c->nranks; r++) {
    snprintf(path, sizeof path, "%s/%s.%d", c->dir, prefix, r);
    while (!file_exists(path)) {
      if (is_aborted(c)) {
        set_last("fake NCCL: communicator aborted (rank %d waiting for rank %d)", c->rank, r);
        return ncclInternalError;
      }
      sleep_ms(1);
    }
  }
  return ncclSuccess;
}

static ncclResult_t do_init(ncclComm_t c) {
  if (env_is("FAKE_NCCL_FAIL", "init")) {
    set_last("fake NCCL: injected init failure (FAKE_NCCL_FAIL=init) on rank %d", c->rank);
    return ncclSystemError;
  }
  char path[300];
  snprintf(path, sizeof path, "%s/init.%d", c->dir, c->rank);
  if (write_file(path, "", 0, NULL, 0) != 0) {
    set_last("fake NCCL: cannot write %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  return wait_all(c, "init");
}

/* ---- reduction ---- */

static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else { /* subnormal */
      exp = 127 - 15 + 1;
      while ((man & 0x400) == 0) {
        man <<= 1;
        exp--;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

static uint16_t float_to_half(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int32_t exp = (int32_t)((x >> 23) & 0xff);
  uint32_t man = x & 0x7fffff;
  if (exp == 255) return (uint16_t)(sign | 0x7c00 | (man ? 0x200 : 0));
  exp = exp - 127 + 15;
  if (exp >= 31) return (uint16_t)(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return (uint16_t)sign;
    man |= 0x800000;
    uint32_t shift = (uint32_t)(14 - exp);
    uint32_t h = man >> shift, rem = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (h & 1))) h++;
    return (uint16_t)(sign | h);
  }
  uint32_t h = ((uint32_t)exp << 10) | (man >> 13), rem = man & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* may carry into the exponent: still right */
  return (uint16_t)(sign | h);
}

static float bf16_to_float(uint16_t b) {
  uint32_t x = (uint32_t)b << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static uint16_t float_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

static size_t dtype_size(int dt) {
  switch (dt) {
    case ncclInt32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclFloat64:
      return 8;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
  }
  return 0;
}

/* reduce combines n contributions (in rank order) of count elements into out. */
static void reduce(const unsigned char **in, int n, void *out, size_t count, int dt, int op) {
  for (size_t i = 0; i < count; i++) {
    switch (dt) {
      case ncclInt32: {
        uint32_t s = 0;
        for (int r = 0; r < n; r++) s += ((const uint32_t *)in[r])[i];
        int32_t v = (int32_t)s;
        ((int32_t *)out)[i] = op == ncclAvg ? v / n : v;
        break;
      }
      case ncclInt64: {
        uint64_t s = 0;
        for (int r = 0; r < n; r++) s += ((const uint64_t *)in[r])[i];
        int64_t v = (int64_t)s;
        ((int64_t *)out)[i] = op == ncclAvg ? v / n : v;
        break;
      }
      case ncclFloat32: {
        float s = 0;
        for (int r = 0; r < n; r++) s += ((const float *)in[r])[i];
        ((float *)out)[i] = op == ncclAvg ? s / (float)n : s;
        break;
      }
      case ncclFloat64: {
        double s = 0;
        for (int r = 0; r < n; r++) s += ((const double *)in[r])[i];
        ((double *)out)[i] = op == ncclAvg ? s / (double)n : s;
        break;
      }
      case ncclFloat16:
      case ncclBfloat16: {
        float s = 0;
        for (int r = 0; r < n; r++) {
          uint16_t h = ((const uint16_t *)in[r])[i];
          s += dt == ncclFloat16 ? half_to_float(h) : bf16_to_float(h);
        }
        if (op == ncclAvg) s /= (float)n;
        ((uint16_t *)out)[i] = dt == ncclFloat16 ? float_to_half(s) : float_to_bf16(s);
        break;
      }
    }
  }
}

struct header {
  uint64_t count;
  int32_t dtype, op;
};

static ncclResult_t do_allreduce(ncclComm_t c, const void *send, void *recv, size_t count, int dt, int op, long seq) {
  if (env_is("FAKE_NCCL_HANG", "allreduce")) {
    while (!is_aborted(c)) sleep_ms(1);
    set_last("fake NCCL: communicator aborted during a hung allreduce (FAKE_NCCL_HANG=allreduce), rank %d", c->rank);
    return ncclInternalError;
  }
  if (env_is("FAKE_NCCL_FAIL", "allreduce")) {
    set_last("fake NCCL: injected allreduce failure (FAKE_NCCL_FAIL=allreduce) on rank %d", c->rank);
    return ncclSystemError;
  }
  size_t bytes = count * dtype_size(dt);
  struct header h = {count, dt, op};
  char path[300], prefix[64];
  snprintf(prefix, sizeof prefix, "ar.%ld", seq);
  snprintf(path, sizeof path, "%s/%s.%d", c->dir, prefix, c->rank);
  if (write_file(path, &h, sizeof h, send, bytes) != 0) {
    set_last("fake NCCL: cannot write %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  ncclResult_t r = wait_all(c, prefix);
  if (r != ncclSuccess) return r;
  unsigned char **in = calloc(c->nranks, sizeof *in);
  r = ncclSuccess;
  for (int i = 0; i < c->nranks && r == ncclSuccess; i++) {
    snprintf(path, sizeof path, "%s/%s.%d", c->dir, prefix, i);
    FILE *f = fopen(path, "rb");
    struct header hi;
    if (f == NULL || fread(&hi, sizeof hi, 1, f) != 1) {
      set_last("fake NCCL: cannot read %s", path);
      r = ncclSystemError;
    } else if (hi.count != h.count || hi.dtype != h.dtype || hi.op != h.op) {
      set_last("fake NCCL: collective %ld: rank %d has count %llu dtype %d op %d, rank %d has count %llu dtype %d op %d",
               seq, c->rank, (unsigned long long)h.count, h.dtype, h.op, i, (unsigned long long)hi.count, hi.dtype,
               hi.op);
      r = ncclInvalidUsage;
    } else {
      in[i] = malloc(bytes ? bytes : 1);
      if (bytes && fread(in[i], 1, bytes, f) != bytes) {
        set_last("fake NCCL: short read of %s", path);
        r = ncclSystemError;
      }
    }
    if (f) fclose(f);
  }
  if (r == ncclSuccess) reduce((const unsigned char **)in, c->nranks, recv, count, dt, op);
  for (int i = 0; i < c->nranks; i++) free(in[i]);
  free(in);
  return r;
}

/* ---- non-blocking operations ---- */

static void *op_main(void *arg) {
  ncclComm_t c = arg;
  ncclResult_t r = ncclSuccess;
  switch (c->op) {
    case OP_INIT:
      r = do_init(c);
      break;
    case OP_ALLREDUCE:
      r = do_allreduce(c, c->send, c->recv, c->count, c->dtype, c->redop, c->opseq);
      break;
    case OP_FINALIZE:
      break;
  }
  pthread_mutex_lock(&c->mu);
  c->result = r;
  c->done = 1;
  pthread_mutex_unlock(&c->mu);
  return NULL;
}

/* start runs op on the background thread; the caller returns ncclInProgress.
 * c->mu is held. */
static ncclResult_t start(ncclComm_t c, int op) {
  if (c->has_thread) pthread_join(c->thread, NULL);
  c->has_thread = 0;
  c->op = op;
  c->want = env_int("FAKE_NCCL_INPROGRESS", 0);
  c->reports = 1; /* this return */
  c->done = 0;
  c->async = ncclInProgress;
  if (pthread_create(&c->thread, NULL, op_main, c) != 0) {
    set_last("fake NCCL: pthread_create failed");
    c->async = ncclSystemError;
    return ncclSystemError;
  }
  c->has_thread = 1;
  return ncclInProgress;
}

static ncclComm_t new_comm(int nranks, const ncclUniqueId *id, int rank, int blocking) {
  ncclComm_t c = calloc(1, sizeof *c);
  c->rank = rank;
  c->nranks = nranks;
  c->blocking = blocking;
  memcpy(c->dir, id->internal, sizeof c->dir);
  c->dir[sizeof c->dir - 1] = 0;
  pthread_mutex_init(&c->mu, NULL);
  c->async = ncclSuccess;
  return c;
}

static void free_comm(ncclComm_t c) {
  if (c->has_thread) pthread_join(c->thread, NULL);
  pthread_mutex_destroy(&c->mu);
  free(c);
}

static int thread_has_ctx(void);

/* ---- the API ---- */

EXPORT ncclResult_t ncclGetVersion(int *version) {
  if (version == NULL) return ncclInvalidArgument;
  *version = env_int("FAKE_NCCL_VERSION", 22005);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclGetUniqueId(ncclUniqueId *id) {
  if (id == NULL) return ncclInvalidArgument;
  const char *base = getenv("FAKE_NCCL_DIR");
  if (base == NULL || *base == 0) base = getenv("TMPDIR");
  if (base == NULL || *base == 0) base = "/tmp";
  char path[sizeof id->internal + 32];
  int n = snprintf(path, sizeof path, "%s/fakenccl-XXXXXX", base);
  if (n < 0 || n >= (int)sizeof id->internal) {
    set_last("fake NCCL: directory name %s/fakenccl-XXXXXX does not fit in a unique id", base);
    return ncclInvalidUsage;
  }
  if (mkdtemp(path) == NULL) {
    set_last("fake NCCL: mkdtemp %s: %s", path, strerror(errno));
    return ncclSystemError;
  }
  memset(id, 0, sizeof *id);
  memcpy(id->internal, path, strlen(path));
  return ncclSuccess;
}

static ncclResult_t check_init(ncclComm_t *comm, int nranks, int rank) {
  if (comm == NULL) return ncclInvalidArgument;
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    set_last("fake NCCL: invalid rank %d of %d", rank, nranks);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) {
  ncclResult_t r = check_init(comm, nranks, rank);
  if (r != ncclSuccess) return r;
  record("init rank=%d nranks=%d api=ncclCommInitRank cuda_ctx=%d", rank, nranks, thread_has_ctx());
  ncclComm_t c = new_comm(nranks, &commId, rank, 1);
  r = do_init(c);
  if (r != ncclSuccess) {
    free_comm(c);
    return r;
  }
  *comm = c;
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank,
                                           ncclConfig_t *config) {
  ncclResult_t r = check_init(comm, nranks, rank);
  if (r != ncclSuccess) return r;
  ncclConfig_t cfg = {sizeof(ncclConfig_t), 0xcafebeef, 22700, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,
                      NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT, NULL, NCCL_CONFIG_UNDEF_INT,
                      NCCL_CONFIG_UNDEF_INT, NULL, NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT,
                      NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT};
  size_t size = 0;
  if (config != NULL) {
    cfg.magic = 0;
    memcpy(&size, config, sizeof size);
    memcpy(&cfg, config, size < sizeof cfg ? size : sizeof cfg);
    if (cfg.magic != 0xcafebeef) {
      set_last("ncclConfig_t argument not initialized via NCCL_CONFIG_INITIALIZER");
      return ncclInvalidArgument;
    }
  }
  /* Fields newer than the caller's declaration get NCCL's defaults back
   * (they may hold the caller's padding). */
  int copiedTrafficClass = cfg.trafficClass;
  if (cfg.version < 21400) cfg.blocking = NCCL_CONFIG_UNDEF_INT;
  if (cfg.version < 21700) {
    cfg.cgaClusterSize = cfg.minCTAs = cfg.maxCTAs = NCCL_CONFIG_UNDEF_INT;
    cfg.netName = NULL;
  }
  if (cfg.version < 22500) cfg.trafficClass = NCCL_CONFIG_UNDEF_INT;
  if (cfg.version < 22700) cfg.collnetEnable = cfg.CTAPolicy = cfg.shrinkShare = cfg.nvlsCTAs = NCCL_CONFIG_UNDEF_INT;
  record("init rank=%d nranks=%d api=ncclCommInitRankConfig size=%zu magic=0x%x version=%u blocking=%d "
         "cgaClusterSize=%d minCTAs=%d maxCTAs=%d netName=%s splitShare=%d trafficClass=%d collnetEnable=%d "
         "copiedTrafficClass=%d",
         rank, nranks, size, cfg.magic, cfg.version, cfg.blocking, cfg.cgaClusterSize, cfg.minCTAs, cfg.maxCTAs,
         cfg.netName ? cfg.netName : "NULL", cfg.splitShare, cfg.trafficClass, cfg.collnetEnable, copiedTrafficClass);
  if (cfg.blocking != NCCL_CONFIG_UNDEF_INT && cfg.blocking != 0 && cfg.blocking != 1) {
    set_last("Invalid config blocking attribute value %d", cfg.blocking);
    return ncclInvalidArgument;
  }
  if (cfg.blocking != 0) return ncclCommInitRank(comm, nranks, commId, rank);
  ncclComm_t c = new_comm(nranks, &commId, rank, 0);
  pthread_mutex_lock(&c->mu);
  r = start(c, OP_INIT);
  pthread_mutex_unlock(&c->mu);
  *comm = c;
  return r;
}

EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t *state) {
  if (c == NULL || state == NULL) return ncclInvalidArgument;
  enter(c);
  pthread_mutex_lock(&c->mu);
  if (c->fail_at.tv_sec != 0 && c->async == ncclSuccess) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    if (now.tv_sec > c->fail_at.tv_sec || (now.tv_sec == c->fail_at.tv_sec && now.tv_nsec >= c->fail_at.tv_nsec)) {
      set_last("fake NCCL: rank %d lost a peer mid-collective (FAKE_NCCL_FAIL=async)", c->rank);
      c->async = ncclRemoteError;
    }
  }
  if (c->async == ncclInProgress) {
    if (c->done && c->reports >= c->want) {
      c->async = c->result;
      if (c->op == OP_ALLREDUCE)
        record("inprogress op=allreduce rank=%d seq=%ld reports=%d result=%d", c->rank, c->opseq, c->reports,
               c->result);
      else
        record("inprogress op=%s rank=%d reports=%d result=%d", opnames[c->op], c->rank, c->reports, c->result);
    } else {
      c->reports++;
    }
  }
  *state = c->async;
  pthread_mutex_unlock(&c->mu);
  leave(c);
  return ncclSuccess;
}

static void stream_enqueued(cudaStream_t stream, ncclComm_t c);
static int thread_has_ctx(void);
static void streams_release(ncclComm_t c);

EXPORT ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype,
                                  ncclRedOp_t op, ncclComm_t c, cudaStream_t stream) {
  if (c == NULL) return ncclInvalidArgument;
  if (env_is("FAKE_NCCL_HANG", "stream") || env_is("FAKE_NCCL_FAIL", "async")) {
    /* The kernel is "launched" and never ends; the host call succeeds. */
    record("allreduce rank=%d count=%zu dtype=%d op=%d hang=stream", c->rank, count, datatype, op);
    stream_enqueued(stream, c);
    if (env_is("FAKE_NCCL_FAIL", "async")) {
      pthread_mutex_lock(&c->mu);
      clock_gettime(CLOCK_MONOTONIC, &c->fail_at);
      c->fail_at.tv_nsec += 50000000;
      if (c->fail_at.tv_nsec >= 1000000000) {
        c->fail_at.tv_sec++;
        c->fail_at.tv_nsec -= 1000000000;
      }
      pthread_mutex_unlock(&c->mu);
    }
    return ncclSuccess;
  }
  if (dtype_size(datatype) == 0 || (op != ncclSum && op != ncclAvg)) {
    set_last("fake NCCL: unsupported data type %d or op %d", datatype, op);
    return ncclInvalidArgument;
  }
  if (count > 0 && (sendbuff == NULL || recvbuff == NULL)) {
    set_last("fake NCCL: NULL buffer");
    return ncclInvalidArgument;
  }
  enter(c);
  pthread_mutex_lock(&c->mu);
  ncclResult_t r;
  if (is_aborted(c)) {
    set_last("fake NCCL: communicator aborted");
    r = ncclInvalidUsage;
  } else if (c->async != ncclSuccess) {
    r = c->async == ncclInProgress ? ncclInvalidUsage : c->async;
    set_last("fake NCCL: allreduce on a communicator in state %d", c->async);
  } else {
    long seq = c->seq++;
    record("allreduce rank=%d seq=%ld count=%zu dtype=%d op=%d inplace=%d", c->rank, seq, count, datatype, op,
           sendbuff == recvbuff);
    if (count == 0) {
      r = ncclSuccess;
    } else if (!c->blocking) {
      c->send = sendbuff;
      c->recv = recvbuff;
      c->count = count;
      c->dtype = datatype;
      c->redop = op;
      c->opseq = seq;
      r = start(c, OP_ALLREDUCE);
    } else {
      pthread_mutex_unlock(&c->mu);
      r = do_allreduce(c, sendbuff, recvbuff, count, datatype, op, seq);
      pthread_mutex_lock(&c->mu);
      if (r == ncclSystemError && env_is("FAKE_NCCL_FAIL", "allreduce")) {
        c->async = r; /* an asynchronous error: the call itself succeeded */
        r = ncclSuccess;
      }
    }
  }
  pthread_mutex_unlock(&c->mu);
  leave(c);
  if (r == ncclSuccess || r == ncclInProgress) stream_enqueued(stream, NULL);
  return r;
}

EXPORT ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (c == NULL) return ncclInvalidArgument;
  enter(c);
  pthread_mutex_lock(&c->mu);
  record("finalize rank=%d", c->rank);
  ncclResult_t r = c->async;
  if (r == ncclSuccess && !c->blocking) r = start(c, OP_FINALIZE);
  pthread_mutex_unlock(&c->mu);
  leave(c);
  return r;
}

EXPORT ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == NULL) return ncclSuccess;
  record("destroy rank=%d", c->rank);
  free_comm(c);
  return ncclSuccess;
}

EXPORT ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (c == NULL) return ncclSuccess;
  __atomic_store_n(&c->aborted, 1, __ATOMIC_RELEASE);
  while (__atomic_load_n(&c->busy, __ATOMIC_ACQUIRE) > 0) sleep_ms(1);
  record("abort rank=%d", c->rank);
  streams_release(c);
  free_comm(c);
  return ncclSuccess;
}

EXPORT const char *ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

EXPORT const char *ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return lasterr;
}

/* ---- the fake CUDA driver ---- */

typedef int CUresult;
enum {
  CUDA_SUCCESS = 0,
  CUDA_ERROR_INVALID_VALUE = 1,
  CUDA_ERROR_NOT_INITIALIZED = 3,
  CUDA_ERROR_NO_DEVICE = 100,
  CUDA_ERROR_INVALID_CONTEXT = 201,
  CUDA_ERROR_INVALID_HANDLE = 400,
  CUDA_ERROR_NOT_READY = 600,
};

struct fstream {
  cudaStream_t key; /* NULL: the legacy default stream */
  uint64_t busy_until; /* CLOCK_MONOTONIC ns when its last work ends */
  ncclComm_t stuck_by; /* FAKE_NCCL_HANG=stream: until this comm aborts */
  int stuck;
  uint64_t unstuck_at;
  struct fstream *next;
};

struct CUevent_st {
  int recorded, pending; /* pending: recorded behind a stuck kernel */
  uint64_t t;            /* when the stream reaches it */
  struct fstream *s;
};

static pthread_mutex_t cumu = PTHREAD_MUTEX_INITIALIZER;
static struct fstream *streams;
static int cu_inited;
static long live_events;
static char primary_ctx;
static __thread void *cur_ctx;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* find_stream returns key's state, made on first use. cumu is held. */
static struct fstream *find_stream(cudaStream_t key) {
  for (struct fstream *s = streams; s != NULL; s = s->next)
    if (s->key == key) return s;
  struct fstream *s = calloc(1, sizeof *s);
  s->key = key;
  s->next = streams;
  streams = s;
  return s;
}

/* stream_enqueued accounts for a collective on stream; hung_by, when not
 * NULL, is the communicator whose kernel never ends. */
static void stream_enqueued(cudaStream_t stream, ncclComm_t hung_by) {
  pthread_mutex_lock(&cumu);
  struct fstream *s = find_stream(stream);
  if (hung_by != NULL) {
    s->stuck = 1;
    s->stuck_by = hung_by;
  } else {
    uint64_t now = now_ns();
    if (s->busy_until < now) s->busy_until = now;
    s->busy_until += (uint64_t)env_int("FAKE_CUDA_KERNEL_MS", 0) * 1000000u;
  }
  pthread_mutex_unlock(&cumu);
}

/* streams_release ends the hung kernels of c: an abort makes them exit. */
static void streams_release(ncclComm_t c) {
  pthread_mutex_lock(&cumu);
  uint64_t now = now_ns();
  for (struct fstream *s = streams; s != NULL; s = s->next) {
    if (s->stuck && s->stuck_by == c) {
      s->stuck = 0;
      s->stuck_by = NULL;
      s->unstuck_at = now;
      if (s->busy_until < now) s->busy_until = now;
    }
  }
  pthread_mutex_unlock(&cumu);
}

/* thread_has_ctx: whether a CUDA context is current on this thread (NCCL
 * takes the device from it at init). */
static int thread_has_ctx(void) { return cur_ctx != NULL; }

static CUresult cu_ready(void) {
  if (!__atomic_load_n(&cu_inited, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;
  if (cur_ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuInit(unsigned int flags) {
  if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
  if (env_is("FAKE_CUDA_FAIL", "init")) return CUDA_ERROR_NO_DEVICE;
  __atomic_store_n(&cu_inited, 1, __ATOMIC_RELEASE);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuDriverGetVersion(int *v) {
  if (v == NULL) return CUDA_ERROR_INVALID_VALUE;
  *v = 12080;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxGetCurrent(void **ctx) {
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (!__atomic_load_n(&cu_inited, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;
  if (cur_ctx == NULL && !env_is("FAKE_CUDA_AUTOCTX", "0")) cur_ctx = &primary_ctx;
  *ctx = cur_ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuCtxSetCurrent(void *ctx) {
  if (!__atomic_load_n(&cu_inited, __ATOMIC_ACQUIRE)) return CUDA_ERROR_NOT_INITIALIZED;
  if (ctx != NULL && ctx != &primary_ctx) return CUDA_ERROR_INVALID_CONTEXT;
  cur_ctx = ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamGetCtx(cudaStream_t s, void **ctx) {
  (void)s;
  if (ctx == NULL) return CUDA_ERROR_INVALID_VALUE;
  *ctx = &primary_ctx;
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamCreate(cudaStream_t *s, unsigned int flags) {
  (void)flags;
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  *s = malloc(1); /* a unique handle */
  return CUDA_SUCCESS;
}

EXPORT CUresult cuStreamDestroy_v2(cudaStream_t s) {
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  pthread_mutex_lock(&cumu);
  for (struct fstream **p = &streams; *p != NULL; p = &(*p)->next) {
    if ((*p)->key == s) { /* events recorded on it keep a pointer: keep the state */
      (*p)->key = (cudaStream_t)-1;
      break;
    }
  }
  pthread_mutex_unlock(&cumu);
  free(s);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventCreate(struct CUevent_st **e, unsigned int flags) {
  (void)flags;
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (e == NULL) return CUDA_ERROR_INVALID_VALUE;
  *e = calloc(1, sizeof **e);
  __atomic_add_fetch(&live_events, 1, __ATOMIC_ACQ_REL);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventDestroy_v2(struct CUevent_st *e) {
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  free(e);
  __atomic_sub_fetch(&live_events, 1, __ATOMIC_ACQ_REL);
  return CUDA_SUCCESS;
}

EXPORT CUresult cuEventRecord(struct CUevent_st *e, cudaStream_t stream) {
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&cumu);
  struct fstream *s = find_stream(stream);
  uint64_t now = now_ns();
  e->recorded = 1;
  e->s = s;
  e->pending = s->stuck;
  e->t = s->busy_until > now ? s->busy_until : now;
  pthread_mutex_unlock(&cumu);
  return CUDA_SUCCESS;
}

/* event_done reports whether e has completed. cumu is held. */
static int event_done(struct CUevent_st *e) {
  if (!e->recorded) return 1;
  if (e->pending) {
    if (e->s->stuck) return 0;
    e->pending = 0;
    if (e->t < e->s->unstuck_at) e->t = e->s->unstuck_at;
  }
  return now_ns() >= e->t;
}

EXPORT CUresult cuEventQuery(struct CUevent_st *e) {
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (e == NULL) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&cumu);
  int done = event_done(e);
  pthread_mutex_unlock(&cumu);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuEventSynchronize(struct CUevent_st *e) {
  CUresult r;
  while ((r = cuEventQuery(e)) == CUDA_ERROR_NOT_READY) sleep_ms(1);
  return r;
}

EXPORT CUresult cuEventElapsedTime(float *ms, struct CUevent_st *a, struct CUevent_st *b) {
  CUresult r = cu_ready();
  if (r != CUDA_SUCCESS) return r;
  if (ms == NULL) return CUDA_ERROR_INVALID_VALUE;
  if (a == NULL || b == NULL || !a->recorded || !b->recorded) return CUDA_ERROR_INVALID_HANDLE;
  pthread_mutex_lock(&cumu);
  int done = event_done(a) && event_done(b);
  if (done) *ms = (float)((double)((int64_t)(b->t - a->t)) / 1e6);
  pthread_mutex_unlock(&cumu);
  return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

EXPORT CUresult cuGetErrorName(CUresult r, const char **s) {
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (r) {
    case CUDA_SUCCESS: *s = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_NO_DEVICE: *s = "CUDA_ERROR_NO_DEVICE"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_READY: *s = "CUDA_ERROR_NOT_READY"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

EXPORT CUresult cuGetErrorString(CUresult r, const char **s) {
  if (s == NULL) return CUDA_ERROR_INVALID_VALUE;
  switch (r) {
    case CUDA_SUCCESS: *s = "no error"; break;
    case CUDA_ERROR_INVALID_VALUE: *s = "invalid argument"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *s = "initialization error"; break;
    case CUDA_ERROR_NO_DEVICE: *s = "no CUDA-capable device is detected"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *s = "invalid device context"; break;
    case CUDA_ERROR_INVALID_HANDLE: *s = "invalid resource handle"; break;
    case CUDA_ERROR_NOT_READY: *s = "device not ready"; break;
    default: *s = NULL; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

EXPORT long fakeCudaLiveEvents(void) { return __atomic_load_n(&live_events, __ATOMIC_ACQUIRE); }

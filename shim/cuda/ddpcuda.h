/* ddpcuda.h: the CUDA driver calls of package cuda, resolved at run time.
 * Types as CUDA's cuda.h declares them; nothing here needs CUDA to build. */
#ifndef DDPCUDA_H
#define DDPCUDA_H

typedef int CUresult;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;

#define DDPCUDA_SUCCESS 0
#define DDPCUDA_ERROR_NOT_READY 600

#define DDPCUDA_EVENT_DEFAULT 0 /* timing enabled: the events measure the collective */
#define DDPCUDA_STREAM_NON_BLOCKING 1

typedef struct {
  void *handle; /* dlopen handle; NULL when the symbols came from the process */
  CUresult (*init)(unsigned int);
  CUresult (*driverGetVersion)(int *);
  CUresult (*ctxGetCurrent)(CUcontext *);
  CUresult (*ctxSetCurrent)(CUcontext);
  CUresult (*streamGetCtx)(CUstream, CUcontext *);
  CUresult (*eventCreate)(CUevent *, unsigned int);
  CUresult (*eventRecord)(CUevent, CUstream);
  CUresult (*eventQuery)(CUevent);
  CUresult (*eventSynchronize)(CUevent);
  CUresult (*eventElapsedTime)(float *, CUevent, CUevent);
  CUresult (*eventDestroy)(CUevent);
  CUresult (*streamCreate)(CUstream *, unsigned int);
  CUresult (*streamDestroy)(CUstream);
  CUresult (*getErrorString)(CUresult, const char **);
  CUresult (*getErrorName)(CUresult, const char **);
} ddpcuda_lib;

/* ddpcuda_open fills lib from path, or from the process (RTLD_DEFAULT)
 * when path is NULL. On failure it returns -1 and writes why into err. */
__attribute__((visibility("hidden"))) int ddpcuda_open(ddpcuda_lib *lib, const char *path, char *err, size_t errlen);

/* ddpcuda_error describes r as "CUDA_ERROR_X: text". */
__attribute__((visibility("hidden"))) void ddpcuda_error(const ddpcuda_lib *lib, CUresult r, char *out, size_t outlen);

static inline CUresult ddpcuda_init(const ddpcuda_lib *l) { return l->init(0); }
static inline CUresult ddpcuda_driver_version(const ddpcuda_lib *l, int *v) { return l->driverGetVersion(v); }
static inline CUresult ddpcuda_ctx_get(const ddpcuda_lib *l, CUcontext *c) { return l->ctxGetCurrent(c); }
static inline CUresult ddpcuda_ctx_set(const ddpcuda_lib *l, CUcontext c) { return l->ctxSetCurrent(c); }
static inline CUresult ddpcuda_stream_ctx(const ddpcuda_lib *l, CUstream s, CUcontext *c) {
  return l->streamGetCtx ? l->streamGetCtx(s, c) : 801; /* CUDA_ERROR_NOT_SUPPORTED */
}
static inline CUresult ddpcuda_event_create(const ddpcuda_lib *l, CUevent *e) {
  return l->eventCreate(e, DDPCUDA_EVENT_DEFAULT);
}
static inline CUresult ddpcuda_event_record(const ddpcuda_lib *l, CUevent e, CUstream s) { return l->eventRecord(e, s); }
static inline CUresult ddpcuda_event_query(const ddpcuda_lib *l, CUevent e) { return l->eventQuery(e); }
static inline CUresult ddpcuda_event_sync(const ddpcuda_lib *l, CUevent e) { return l->eventSynchronize(e); }
static inline CUresult ddpcuda_event_elapsed(const ddpcuda_lib *l, float *ms, CUevent a, CUevent b) {
  return l->eventElapsedTime(ms, a, b);
}
static inline CUresult ddpcuda_event_destroy(const ddpcuda_lib *l, CUevent e) { return l->eventDestroy(e); }
static inline CUresult ddpcuda_stream_create(const ddpcuda_lib *l, CUstream *s) {
  return l->streamCreate(s, DDPCUDA_STREAM_NON_BLOCKING);
}
static inline CUresult ddpcuda_stream_destroy(const ddpcuda_lib *l, CUstream s) { return l->streamDestroy(s); }

#endif

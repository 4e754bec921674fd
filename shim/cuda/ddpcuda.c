// ddpcuda.c: resolving the CUDA driver API. See ddpcuda.h.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "ddpcuda.h"

struct sym {
  const char *name;
  const char *fallback; /* the pre-_v2 name, for old drivers */
  size_t offset;
  int required;
};

#define SYM(field, name, fb, req) {name, fb, offsetof(ddpcuda_lib, field), req}

/* cuda.h maps cuEventDestroy and cuStreamDestroy to their _v2 entry points;
 * the others have kept their first ABI. */
static const struct sym syms[] = {
    SYM(init, "cuInit", NULL, 1),
    SYM(driverGetVersion, "cuDriverGetVersion", NULL, 1),
    SYM(ctxGetCurrent, "cuCtxGetCurrent", NULL, 1),
    SYM(ctxSetCurrent, "cuCtxSetCurrent", NULL, 1),
    SYM(streamGetCtx, "cuStreamGetCtx", NULL, 0),
    SYM(eventCreate, "cuEventCreate", NULL, 1),
    SYM(eventRecord, "cuEventRecord", NULL, 1),
    SYM(eventQuery, "cuEventQuery", NULL, 1),
    SYM(eventSynchronize, "cuEventSynchronize", NULL, 1),
    SYM(eventElapsedTime, "cuEventElapsedTime", NULL, 1),
    SYM(eventDestroy, "cuEventDestroy_v2", "cuEventDestroy", 1),
    SYM(streamCreate, "cuStreamCreate", NULL, 1),
    SYM(streamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy", 1),
    SYM(getErrorString, "cuGetErrorString", NULL, 1),
    SYM(getErrorName, "cuGetErrorName", NULL, 1),
};

int ddpcuda_open(ddpcuda_lib *lib, const char *path, char *err, size_t errlen) {
  memset(lib, 0, sizeof *lib);
  void *h = RTLD_DEFAULT;
  if (path != NULL) {
    dlerror();
    h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (h == NULL) {
      const char *e = dlerror();
      snprintf(err, errlen, "%s", e ? e : "dlopen failed");
      return -1;
    }
    lib->handle = h;
  }
  for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
    void *p = dlsym(h, syms[i].name);
    if (p == NULL && syms[i].fallback != NULL) p = dlsym(h, syms[i].fallback);
    if (p == NULL && syms[i].required) {
      snprintf(err, errlen, "%s not found", syms[i].name);
      if (lib->handle != NULL) dlclose(lib->handle);
      memset(lib, 0, sizeof *lib);
      return -1;
    }
    memcpy((char *)lib + syms[i].offset, &p, sizeof p);
  }
  return 0;
}

void ddpcuda_error(const ddpcuda_lib *lib, CUresult r, char *out, size_t outlen) {
  const char *name = NULL, *text = NULL;
  if (lib->getErrorName(r, &name) != DDPCUDA_SUCCESS || name == NULL) name = "CUDA error";
  if (lib->getErrorString(r, &text) != DDPCUDA_SUCCESS || text == NULL) text = "unknown";
  snprintf(out, outlen, "%s (%d): %s", name, r, text);
}

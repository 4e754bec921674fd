// Package nccltest builds and loads the fake libnccl.so.2 of
// shim/nccl/testdata/fakenccl.c, for tests of the NCCL transport on
// machines without GPUs (Go tests here, Python tests through the same gcc
// command, which Build documents). The fake's knobs (FAKE_NCCL_VERSION,
// FAKE_NCCL_INPROGRESS, FAKE_NCCL_FAIL, FAKE_NCCL_HANG, FAKE_NCCL_RECORD,
// FAKE_NCCL_DIR) are described at the top of fakenccl.c.
package nccltest

// #cgo LDFLAGS: -ldl
// #define _GNU_SOURCE
// #include <dlfcn.h>
// #include <stdlib.h>
// static long live_events(const char *path, const char **err) {
//   void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
//   if (h == NULL) { *err = dlerror(); return -1; }
//   long (*f)(void) = (long (*)(void))dlsym(h, "fakeCudaLiveEvents");
//   long n = f ? f() : -1;
//   if (f == NULL) *err = "fakeCudaLiveEvents not found";
//   dlclose(h);
//   return n;
// }
// static int resolvable(const char *soname) {
//   void *h = dlopen(soname, RTLD_LAZY | RTLD_LOCAL);
//   if (h == NULL) return 0;
//   dlclose(h);
//   return 1;
// }
// static const char *preload(const char *path) {
//   dlerror();
//   return dlopen(path, RTLD_NOW | RTLD_GLOBAL) ? NULL : dlerror();
// }
import "C"

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"unsafe"
)

// LibName is the file name Build writes, the soname NCCL is loaded by.
const LibName = "libnccl.so.2"

// ErrNoCompiler means gcc is not on PATH; tests skip on it.
var ErrNoCompiler = errors.New("nccltest: gcc not found")

// Source returns the path of fakenccl.c in this source tree.
func Source() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("nccltest: cannot locate the source tree")
	}
	src := filepath.Join(filepath.Dir(file), "..", "testdata", "fakenccl.c")
	if _, err := os.Stat(src); err != nil {
		return "", fmt.Errorf("nccltest: %w", err)
	}
	return src, nil
}

// Build compiles the fake into dir/libnccl.so.2 and returns its path. It
// runs
//
//	gcc -shared -fPIC -O2 -pthread -o DIR/libnccl.so.2 shim/nccl/testdata/fakenccl.c
//
// and returns ErrNoCompiler when there is no gcc.
func Build(dir string) (string, error) {
	gcc, err := exec.LookPath("gcc")
	if err != nil {
		return "", ErrNoCompiler
	}
	src, err := Source()
	if err != nil {
		return "", err
	}
	out := filepath.Join(dir, LibName)
	cmd := exec.Command(gcc, "-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-o", out, src)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("nccltest: build the fake NCCL: %v\n%s", err, b)
	}
	return out, nil
}

// Installed reports whether the loader finds soname ("libnccl.so.2",
// "libcuda.so.1") on this machine without help, as on a machine with a GPU
// or a CUDA image. There the shim's load order takes it before an explicit
// path, so a test that needs the fake in its own process cannot have it:
// such tests skip (CI, without either, runs them).
func Installed(soname string) bool {
	cs := C.CString(soname)
	defer C.free(unsafe.Pointer(cs))
	return C.resolvable(cs) == 1
}

// SkipIfInstalled skips t when the loader finds a real soname (see Installed).
func SkipIfInstalled(t testing.TB, sonames ...string) {
	t.Helper()
	for _, s := range sonames {
		if Installed(s) {
			t.Skipf("a real %s is installed here and would be loaded before the fake; the fake-library tests run where there is none (CI)", s)
		}
	}
}

// Preload dlopens path with RTLD_GLOBAL, so its symbols are the process's
// own, as when PyTorch has loaded NCCL. It cannot be undone: use it in a
// child process.
func Preload(path string) error {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	if e := C.preload(cs); e != nil {
		return fmt.Errorf("nccltest: dlopen %s: %s", path, C.GoString(e))
	}
	return nil
}

// HostBuffer allocates n zeroed bytes outside the Go heap, to stand for
// device memory (the fake keeps using a buffer from a background thread
// while a collective is under way). free releases it.
func HostBuffer(n int) (buf []byte, free func()) {
	if n == 0 {
		return nil, func() {}
	}
	p := C.calloc(C.size_t(n), 1)
	return unsafe.Slice((*byte)(p), n), func() { C.free(p) }
}

// LiveEvents is how many CUDA events the fake driver at path (loaded in
// this process) has made and not destroyed.
func LiveEvents(path string) (int, error) {
	cs := C.CString(path)
	defer C.free(unsafe.Pointer(cs))
	var e *C.char
	n := C.live_events(cs, &e)
	if n < 0 {
		return 0, fmt.Errorf("nccltest: %s: %s", path, C.GoString(e))
	}
	return int(n), nil
}

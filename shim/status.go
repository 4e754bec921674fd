package main

// #include <stdlib.h>
// #include "lasterr.h"
import "C"

import (
	"runtime/debug"
	"unsafe"

	"github.com/ddp-agent/ddp-agent/shim/status"
)

// The codes themselves, and how errors map to them, are package status:
// the logic beside this package fails with them. Here they cross into C.

// fail records err as the calling thread's last error and returns its code.
// Exported functions run on the calling C thread, so the thread-local
// message is the caller's.
func fail(err error) C.int {
	rc := status.Of(err)
	msg := err.Error()
	cs := C.CString(msg)
	C.ddpshim_set_error(cs, C.size_t(len(msg)))
	C.free(unsafe.Pointer(cs))
	return C.int(rc)
}

// guard turns a panic into DDPSHIM_ERR_INTERNAL: a bug must not take the
// training process down with it.
func guard(fn string, rc *C.int) {
	if r := recover(); r != nil {
		*rc = fail(status.Errorf(status.Internal, "%s: internal error: %v\n%s", fn, r, debug.Stack()))
	}
}

func result(err error) C.int {
	if err != nil {
		return fail(err)
	}
	return status.OK
}

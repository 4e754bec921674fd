// Package cuda is the part of the CUDA driver API the shim needs for the
// NCCL transport's watchdog: events recorded around each collective on the
// caller's stream, queried and timed from another thread. Like package
// nccl, it resolves libcuda at run time, so it builds with gcc alone and
// loads on machines without a GPU (Load then fails).
//
// Load looks in the order package nccl uses: the symbols already in the
// process (the driver PyTorch loaded), dlopen("libcuda.so.1"), then an
// explicit path (DDP_AGENT_CUDA_LIB, which the caller reads: tests point it
// at the fake driver of shim/nccl/testdata/fakenccl.c).
//
// Driver calls act on the calling thread's current context: a goroutine
// that uses events from a thread other than the one that made them locks
// its OS thread and calls Bind first.
package cuda

// #cgo LDFLAGS: -ldl
// #include <stdlib.h>
// #include "ddpcuda.h"
import "C"

import (
	"errors"
	"fmt"
	"time"
	"unsafe"
)

// Sources for Lib.Source, besides an explicit path.
const (
	FromProcess = "process"
	FromSoname  = "libcuda.so.1"
)

// Lib is a loaded CUDA driver.
type Lib struct {
	c      C.ddpcuda_lib
	source string
	driver int
}

// Error is a failed driver call.
type Error struct {
	Func string
	Code int
	Msg  string // "CUDA_ERROR_X (n): text"
}

func (e *Error) Error() string { return e.Func + ": " + e.Msg }

// ErrNotReady is what a pending event's query returns (CUDA_ERROR_NOT_READY).
var ErrNotReady = errors.New("cuda: not ready")

// Load finds and initializes the driver (cuInit). path, when not empty, is
// tried last.
func Load(path string) (*Lib, error) {
	var errs []string
	try := func(p *C.char, source string) (*Lib, bool) {
		l := &Lib{source: source}
		var buf [256]C.char
		if C.ddpcuda_open(&l.c, p, &buf[0], C.size_t(len(buf))) != 0 {
			errs = append(errs, source+": "+C.GoString(&buf[0]))
			return nil, false
		}
		return l, true
	}
	l, ok := try(nil, FromProcess)
	if !ok {
		soname := C.CString(FromSoname)
		l, ok = try(soname, FromSoname)
		C.free(unsafe.Pointer(soname))
	}
	if !ok && path != "" {
		cp := C.CString(path)
		l, ok = try(cp, path)
		C.free(unsafe.Pointer(cp))
	}
	if !ok {
		return nil, fmt.Errorf("no CUDA driver (%s)", joinErrs(errs))
	}
	if err := l.check("cuInit", C.ddpcuda_init(&l.c)); err != nil {
		return nil, err
	}
	var v C.int
	if err := l.check("cuDriverGetVersion", C.ddpcuda_driver_version(&l.c, &v)); err != nil {
		return nil, err
	}
	l.driver = int(v)
	return l, nil
}

func joinErrs(errs []string) string {
	s := ""
	for i, e := range errs {
		if i > 0 {
			s += "; "
		}
		s += e
	}
	return s
}

// Source says where the driver came from: FromProcess, FromSoname or the path.
func (l *Lib) Source() string { return l.source }

// DriverVersion is the CUDA version the driver supports, e.g. "12.8".
func (l *Lib) DriverVersion() string {
	return fmt.Sprintf("%d.%d", l.driver/1000, l.driver%1000/10)
}

func (l *Lib) check(fn string, r C.CUresult) error {
	switch r {
	case C.DDPCUDA_SUCCESS:
		return nil
	case C.DDPCUDA_ERROR_NOT_READY:
		return ErrNotReady
	}
	var buf [256]C.char
	C.ddpcuda_error(&l.c, r, &buf[0], C.size_t(len(buf)))
	return &Error{Func: fn, Code: int(r), Msg: C.GoString(&buf[0])}
}

// Context is a CUDA context handle.
type Context struct{ p C.CUcontext }

// Valid reports whether c is a context (not the empty one).
func (c Context) Valid() bool { return c.p != nil }

// Current returns the calling thread's context; with none, that of stream
// (which may be nil: then the result may be an invalid Context).
func (l *Lib) Current(stream unsafe.Pointer) (Context, error) {
	var c C.CUcontext
	if err := l.check("cuCtxGetCurrent", C.ddpcuda_ctx_get(&l.c, &c)); err != nil {
		return Context{}, err
	}
	if c == nil && stream != nil {
		if err := l.check("cuStreamGetCtx", C.ddpcuda_stream_ctx(&l.c, C.CUstream(stream), &c)); err != nil {
			return Context{}, err
		}
	}
	return Context{c}, nil
}

// Bind makes ctx current on the calling OS thread (lock it first).
func (l *Lib) Bind(ctx Context) error {
	return l.check("cuCtxSetCurrent", C.ddpcuda_ctx_set(&l.c, ctx.p))
}

// Event is a CUDA event with timing.
type Event struct{ p C.CUevent }

// NewEvent makes a timing event in the current context.
func (l *Lib) NewEvent() (Event, error) {
	var e C.CUevent
	if err := l.check("cuEventCreate", C.ddpcuda_event_create(&l.c, &e)); err != nil {
		return Event{}, err
	}
	return Event{e}, nil
}

// Record enqueues e on stream (nil: the legacy default stream).
func (l *Lib) Record(e Event, stream unsafe.Pointer) error {
	return l.check("cuEventRecord", C.ddpcuda_event_record(&l.c, e.p, C.CUstream(stream)))
}

// Done reports whether the work before e's record has completed.
func (l *Lib) Done(e Event) (bool, error) {
	err := l.check("cuEventQuery", C.ddpcuda_event_query(&l.c, e.p))
	if err == ErrNotReady {
		return false, nil
	}
	return err == nil, err
}

// Sync waits for e.
func (l *Lib) Sync(e Event) error {
	return l.check("cuEventSynchronize", C.ddpcuda_event_sync(&l.c, e.p))
}

// Elapsed is the GPU time from a to b, both done; negative when b ran first.
func (l *Lib) Elapsed(a, b Event) (time.Duration, error) {
	var ms C.float
	if err := l.check("cuEventElapsedTime", C.ddpcuda_event_elapsed(&l.c, &ms, a.p, b.p)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// DestroyEvent releases e.
func (l *Lib) DestroyEvent(e Event) error {
	return l.check("cuEventDestroy", C.ddpcuda_event_destroy(&l.c, e.p))
}

// Stream is a CUDA stream the shim owns.
type Stream struct{ p C.CUstream }

// Ptr is the stream handle, for Record.
func (s Stream) Ptr() unsafe.Pointer { return unsafe.Pointer(s.p) }

// NewStream makes a non-blocking stream (it does not wait on the legacy
// default stream) in the current context.
func (l *Lib) NewStream() (Stream, error) {
	var s C.CUstream
	if err := l.check("cuStreamCreate", C.ddpcuda_stream_create(&l.c, &s)); err != nil {
		return Stream{}, err
	}
	return Stream{s}, nil
}

// DestroyStream releases s.
func (l *Lib) DestroyStream(s Stream) error {
	return l.check("cuStreamDestroy", C.ddpcuda_stream_destroy(&l.c, s.p))
}

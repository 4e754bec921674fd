package nccl

import (
	"errors"
	"fmt"
)

// Result is an ncclResult_t.
type Result int

// ncclResult_t values (nccl.h). RemoteError arrived in 2.13, InProgress in
// 2.14, Timeout later.
const (
	Success            Result = 0
	UnhandledCudaError Result = 1
	SystemError        Result = 2
	InternalError      Result = 3
	InvalidArgument    Result = 4
	InvalidUsage       Result = 5
	RemoteError        Result = 6
	InProgress         Result = 7
	Timeout            Result = 8
)

var resultNames = [...]string{
	"ncclSuccess", "ncclUnhandledCudaError", "ncclSystemError", "ncclInternalError",
	"ncclInvalidArgument", "ncclInvalidUsage", "ncclRemoteError", "ncclInProgress", "ncclTimeout",
}

func (r Result) String() string {
	if r >= 0 && int(r) < len(resultNames) {
		return resultNames[r]
	}
	return fmt.Sprintf("ncclResult_t(%d)", int(r))
}

// Error is a failure NCCL reported, with NCCL's own words.
type Error struct {
	Op     string // the NCCL function, e.g. "ncclAllReduce"
	Result Result
	Text   string // ncclGetErrorString(Result)
	Last   string // ncclGetLastError, "" before 2.13; may describe an earlier failure
}

// Error reads like "ncclAllReduce: unhandled system error (run with
// NCCL_DEBUG=INFO for details): <ncclGetLastError>".
func (e *Error) Error() string {
	s := e.Op + ": "
	if e.Text != "" {
		s += e.Text
	} else {
		s += e.Result.String()
	}
	if e.Last != "" {
		s += ": " + e.Last
	}
	return s
}

// Errors that callers branch on with errors.Is. An error from a call on a
// Comm that had already failed wraps ErrAborted as well as the first cause,
// so test for ErrAborted first (Status does).
var (
	// ErrAborted: the Comm was aborted (Abort, Close during a collective, a
	// timeout or an earlier failure).
	ErrAborted = errors.New("nccl: aborted")
	// ErrClosed: the Comm was closed.
	ErrClosed = errors.New("nccl: comm closed")
	// ErrTimeout: an init, collective or finalize did not leave
	// ncclInProgress (or return) within the Comm's timeout.
	ErrTimeout = errors.New("nccl: timeout")
	// ErrInvalid: a bad argument, caught before NCCL was called.
	ErrInvalid = errors.New("nccl: invalid argument")
	// ErrUnsupported: the loaded NCCL is too old for the data type or op.
	ErrUnsupported = errors.New("nccl: not supported by this NCCL version")
)

// LoadError says why no NCCL could be loaded: every place tried, in order.
type LoadError struct {
	Tried []Attempt
}

// Attempt is one place Load looked for NCCL.
type Attempt struct {
	Where string // "process", "libnccl.so.2" or the explicit path
	Err   string // dlerror's text or the missing symbol
}

func (e *LoadError) Error() string {
	s := "nccl: no usable NCCL:"
	for i, a := range e.Tried {
		if i > 0 {
			s += ";"
		}
		s += " " + a.Where + ": " + a.Err
	}
	return s
}

// Status codes of the shim's C ABI (DDPSHIM_OK, DDPSHIM_ERR_* in
// ncclshim/ddpshim.h).
const (
	StatusOK          = 0
	StatusInvalid     = 1
	StatusClosed      = 2
	StatusAborted     = 3
	StatusTimeout     = 4
	StatusPeer        = 5
	StatusMismatch    = 6
	StatusUnavailable = 7
	StatusInternal    = 8
)

// Status maps an error from this package to the shim's status code:
// ErrClosed, then ErrAborted, ErrTimeout, ErrInvalid and ErrUnsupported
// (invalid), *LoadError (unavailable), then NCCL's result: invalid argument
// or usage → invalid, remote or system error (NCCL's words for a peer or
// socket that went away) → peer, ncclTimeout → timeout, anything else
// (CUDA, internal) → internal.
func Status(err error) int {
	var le *LoadError
	var ne *Error
	switch {
	case err == nil:
		return StatusOK
	case errors.Is(err, ErrClosed):
		return StatusClosed
	case errors.Is(err, ErrAborted):
		return StatusAborted
	case errors.Is(err, ErrTimeout):
		return StatusTimeout
	case errors.Is(err, ErrInvalid), errors.Is(err, ErrUnsupported):
		return StatusInvalid
	case errors.As(err, &le):
		return StatusUnavailable
	case errors.As(err, &ne):
		switch ne.Result {
		case InvalidArgument, InvalidUsage:
			return StatusInvalid
		case RemoteError, SystemError:
			return StatusPeer
		case Timeout:
			return StatusTimeout
		}
	}
	return StatusInternal
}

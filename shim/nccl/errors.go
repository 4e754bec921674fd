package nccl

import (
	"errors"
	"fmt"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/status"
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

// Errors wrap the kinds of package failure: ErrAborted (Abort, Close
// during a collective, a timeout or an earlier failure), ErrClosed,
// ErrTimeout (an init, collective or finalize did not leave
// ncclInProgress, or return, within the Comm's timeout) and ErrInvalid (a
// bad argument, caught before NCCL was called). An error from a call on a
// Comm that had already failed wraps ErrAborted as well as the first
// cause, so test for ErrAborted first (Status does).

// ErrUnsupported: the loaded NCCL is too old for the data type or op.
var ErrUnsupported = errors.New("nccl: not supported by this NCCL version")

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

// Status maps an error from this package to the shim's status code
// (package status): the kinds of package failure (closed, then aborted,
// timeout, and invalid with ErrUnsupported), *LoadError (unavailable), then NCCL's result: invalid argument
// or usage → invalid, remote or system error (NCCL's words for a peer or
// socket that went away) → peer, ncclTimeout → timeout, anything else
// (CUDA, internal) → internal.
func Status(err error) int {
	var le *LoadError
	var ne *Error
	switch {
	case err == nil:
		return status.OK
	case errors.Is(err, failure.ErrClosed):
		return status.Closed
	case errors.Is(err, failure.ErrAborted):
		return status.Aborted
	case errors.Is(err, failure.ErrTimeout):
		return status.Timeout
	case errors.Is(err, failure.ErrInvalid), errors.Is(err, ErrUnsupported):
		return status.Invalid
	case errors.As(err, &le):
		return status.Unavailable
	case errors.As(err, &ne):
		switch ne.Result {
		case InvalidArgument, InvalidUsage:
			return status.Invalid
		case RemoteError, SystemError:
			return status.Peer
		case Timeout:
			return status.Timeout
		}
	}
	return status.Internal
}

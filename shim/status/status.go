// Package status holds the status codes of the shim's C ABI (DDPSHIM_OK and
// DDPSHIM_ERR_* in shim/ddpshim.h), the error that carries one, and
// how the kinds of failure (package failure) map to them: one set of codes
// for the packages that fail a call (comm, nccl) and the exports that
// return it. It knows no transport: the transports wrap the kinds, and a
// transport with codes of its own (NCCL's results) maps them itself.
package status

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// The codes, as ddpshim.h defines them.
const (
	OK          = 0
	Invalid     = 1
	Closed      = 2
	Aborted     = 3
	Timeout     = 4
	Peer        = 5
	Mismatch    = 6
	Unavailable = 7
	Internal    = 8
)

// Error carries the code a failure maps to in the C ABI.
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// Errorf is fmt.Errorf with the code the error maps to.
func Errorf(code int, format string, args ...any) error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// AbortedBy reports an earlier failure or abort as DDPSHIM_ERR_ABORTED:
// only the collective that failed first carries the root cause's own code.
func AbortedBy(cause error) error {
	if errors.Is(cause, failure.ErrClosed) {
		return cause
	}
	return &Error{Code: Aborted, Err: cause}
}

// Of maps an error from the transports, the control client or the shim to
// its C status code: the code an *Error carries, else its kind of failure
// (closed, then mismatch, timeout, peer, aborted and invalid: a
// collective that failed on a peer wraps ErrAborted too), else DDPSHIM_ERR_INTERNAL.
func Of(err error) int {
	var se *Error
	switch {
	case err == nil:
		return OK
	case errors.As(err, &se):
		return se.Code
	case errors.Is(err, failure.ErrClosed):
		return Closed
	case errors.Is(err, failure.ErrMismatch):
		return Mismatch
	case errors.Is(err, failure.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return Timeout
	case errors.Is(err, failure.ErrPeer):
		return Peer
	case errors.Is(err, failure.ErrAborted), errors.Is(err, context.Canceled):
		return Aborted
	case errors.Is(err, failure.ErrInvalid):
		return Invalid
	}
	return Internal
}

package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/ddp-agent/ddp-agent/ncclshim/host"
	"github.com/ddp-agent/ddp-agent/ncclshim/host/shm"
)

// Status codes of the C ABI (ddpshim.h).
const (
	rcOK          = 0
	rcInvalid     = 1
	rcClosed      = 2
	rcAborted     = 3
	rcTimeout     = 4
	rcPeer        = 5
	rcMismatch    = 6
	rcUnavailable = 7
	rcInternal    = 8
)

// statusError carries the status code a failure maps to in the C ABI.
type statusError struct {
	rc  int
	err error
}

func (e *statusError) Error() string { return e.err.Error() }
func (e *statusError) Unwrap() error { return e.err }

func errorf(rc int, format string, args ...any) error {
	return &statusError{rc: rc, err: fmt.Errorf(format, args...)}
}

// Sentinels for conditions of the shim itself.
var (
	errAborted = errors.New("communicator aborted")
	errClosed  = errors.New("communicator closed")
)

// statusOf maps an error from the transports, the control client or the
// shim to its C status code.
func statusOf(err error) int {
	var se *statusError
	switch {
	case err == nil:
		return rcOK
	case errors.As(err, &se):
		return se.rc
	case errors.Is(err, errClosed):
		return rcClosed
	case errors.Is(err, host.ErrMismatch), errors.Is(err, shm.ErrMismatch):
		return rcMismatch
	case errors.Is(err, host.ErrTimeout), errors.Is(err, shm.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return rcTimeout
	case errors.Is(err, host.ErrPeer), errors.Is(err, shm.ErrPeer):
		return rcPeer
	case errors.Is(err, errAborted), errors.Is(err, host.ErrAborted), errors.Is(err, shm.ErrAborted), errors.Is(err, context.Canceled):
		return rcAborted
	}
	return rcInternal
}

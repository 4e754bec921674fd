package wire

import (
	"errors"
	"fmt"
)

// ErrorCode classifies an Error reply.
type ErrorCode uint16

// Error codes.
const (
	CodeBadRequest ErrorCode = iota + 1
	CodeDenied
	CodeTimeout
	CodeStaleGeneration
	CodeInternal
	// CodeLimit: the agent refused a request or a connection because it is
	// over one of the control socket's limits (a value's size, a rank's
	// store quota, connections per process or rank); the message names the
	// limit and its value. Added after the others, so that their numbers
	// stay what they were on the wire.
	CodeLimit
)

func (c ErrorCode) String() string {
	names := [...]string{"", "bad request", "denied", "timeout", "stale generation", "internal", "limit exceeded"}
	if c > 0 && int(c) < len(names) {
		return names[c]
	}
	return fmt.Sprintf("code %d", uint16(c))
}

// The conditions an Error reply's code stands for, usable with errors.Is on
// either end: the agent wraps them in the errors it logs, and a
// *RemoteError matches them according to its code.
var (
	ErrTimeout         = errors.New("control: timeout")
	ErrDenied          = errors.New("control: denied")
	ErrStaleGeneration = errors.New("control: stale generation")
	ErrLimit           = errors.New("control: limit exceeded")
)

// RemoteError is an Error reply from the agent.
type RemoteError struct {
	Code    ErrorCode
	Message string
}

func (e *RemoteError) Error() string {
	return fmt.Sprintf("control: agent replied %v: %s", e.Code, e.Message)
}

// Is reports whether the code of e corresponds to the sentinel target.
func (e *RemoteError) Is(target error) bool {
	switch target {
	case ErrTimeout:
		return e.Code == CodeTimeout
	case ErrDenied:
		return e.Code == CodeDenied
	case ErrStaleGeneration:
		return e.Code == CodeStaleGeneration
	case ErrLimit:
		return e.Code == CodeLimit
	}
	return false
}

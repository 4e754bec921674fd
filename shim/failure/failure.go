// Package failure is the shim's one vocabulary of failures: the kinds of
// error that every transport (host, shm, nccl) and the communicator above
// them wrap, and the typed error for a failure that one peer caused.
// Callers branch on them with errors.Is and errors.As; package status maps
// them to the C ABI's codes.
//
// It is a leaf: it imports nothing of the shim's, so that the transports
// and the bottom of the C ABI can all depend on it without depending on
// each other (deps_test.go in shim keeps it so). A new kind goes here,
// with its code in package status.
package failure

import "errors"

// The kinds. A transport wraps one of them with the rank, the peer and the
// step; the communicator wraps the transport's error in turn. An error
// from a collective on a communicator that had already failed wraps
// ErrAborted as well as the first cause.
var (
	// ErrAborted: the communicator was aborted (Abort, Close during a
	// collective, a cancelled context, a timeout or an earlier failure).
	ErrAborted = errors.New("communicator aborted")
	// ErrClosed: the communicator was closed.
	ErrClosed = errors.New("communicator closed")
	// ErrTimeout: a deadline passed (the context's or the communicator's
	// timeout).
	ErrTimeout = errors.New("timeout")
	// ErrPeer: a peer closed, aborted or lost its communicator, failed the
	// handshake or broke the protocol. A failure that names the peer is a
	// *PeerError.
	ErrPeer = errors.New("peer failed")
	// ErrMismatch: ranks disagree on the sequence, count, dtype or op of a
	// collective.
	ErrMismatch = errors.New("ranks disagree")
	// ErrInvalid: a bad argument, caught before anything was sent.
	ErrInvalid = errors.New("invalid argument")
)

// PeerKind is how a peer failed a collective.
type PeerKind string

// The ways a peer can fail a collective. The words are the agent's too
// (the communicator's note for its root cause).
const (
	PeerClosed  PeerKind = "closed"  // it closed its communicator
	PeerLost    PeerKind = "lost"    // its connection broke or its process is gone
	PeerAborted PeerKind = "aborted" // it aborted its communicator (shared memory's abort flag)
)

// PeerError is a failure that one peer caused. Err says the rest and wraps
// ErrPeer; Rank is the peer's rank in the communicator that saw the
// failure (a transport nested in another translates it on the way up).
// The shim tells the agent who failed whom with it, so that a rank that
// failed only because a peer went first is not taken for the root cause.
type PeerError struct {
	Rank int
	Kind PeerKind
	Err  error
}

// Peer is err as a failure that peer caused in the way kind says; err
// should wrap ErrPeer.
func Peer(peer int, kind PeerKind, err error) *PeerError {
	return &PeerError{Rank: peer, Kind: kind, Err: err}
}

func (e *PeerError) Error() string { return e.Err.Error() }
func (e *PeerError) Unwrap() error { return e.Err }

// Package host is the shim's CPU transport: a bandwidth-optimal ring
// all-reduce over TCP, handing the data to shared memory among the ranks
// of each host.
//
// Every rank opens an Endpoint (a listener on an ephemeral port), the caller
// exchanges the endpoints' PeerInfo through its bootstrap channel, and Connect
// builds the ring: rank r dials rank r+1 and accepts rank r-1, one TCP
// connection per direction, each carrying data one way only. AllReduce runs a
// reduce-scatter followed by an all-gather around the ring, cut into segments
// so that receiving, reducing and sending overlap; every byte crosses every
// link 2(n-1)/n times.
//
// With Config.SHM, ranks that all run on one host (equal PeerInfo.HostID)
// all-reduce through a shared-memory segment instead (package shm), set up
// over the ring; the ring then only watches that the peers are alive, so a
// rank that dies fails the others at once rather than at the timeout. When
// the ranks span several hosts with more than one on some, each host gets
// a segment of its own and the job all-reduces hierarchically: within each
// host through shared memory, between hosts over a second ring of the
// hosts' lowest ranks, then back within each host (hier.go).
//
// A Comm runs three goroutines of its own: one receives from the
// predecessor (it also notices when the predecessor goes away between
// collectives), one watches the connection to the successor for the same
// reason, and one fails the Comm when a neighbour's host stops
// acknowledging (a link down: Config.LinkTimeout, linkwatch.go). The
// caller's goroutine sends. Any failure during a collective leaves the byte
// streams out of step, so the Comm aborts itself: Done is closed, and every
// later AllReduce fails at once with the first cause.
package host

import "errors"

// Errors that callers branch on with errors.Is. Returned errors wrap them
// with the rank, the peer and the step. An error from an AllReduce issued on
// a Comm that had already failed wraps ErrAborted as well as the first cause,
// so test for ErrAborted first when mapping errors to status codes.
var (
	// ErrAborted: the Comm was aborted (Abort, Close, a cancelled context
	// or an earlier failure).
	ErrAborted = errors.New("host: aborted")
	// ErrClosed: the Comm was closed; it comes wrapped with ErrAborted.
	ErrClosed = errors.New("host: comm closed")
	// ErrTimeout: the deadline (the context's or Config.Timeout) passed.
	ErrTimeout = errors.New("host: timeout")
	// ErrPeer: a peer closed or reset its connection, failed the handshake
	// or broke the protocol.
	ErrPeer = errors.New("host: peer failed")
	// ErrMismatch: ranks disagree on the sequence, count, dtype or op of a
	// collective.
	ErrMismatch = errors.New("host: ranks disagree")
	// ErrInvalid: a bad argument; nothing was sent and the Comm is intact.
	ErrInvalid = errors.New("host: invalid argument")
)

// The ways a peer can fail a Comm, as PeerError.Kind says them.
const (
	PeerClosed  = "closed"  // it closed its communicator
	PeerLost    = "lost"    // its connection broke: the process died, or reset it
	PeerAborted = "aborted" // it aborted its communicator (shared memory's abort flag)
)

// PeerError is a failure that one peer caused: it closed its communicator,
// its connection broke, or it aborted. It wraps ErrPeer (Err says the
// rest); Rank is the peer's rank in the communicator. The shim tells the
// agent who failed whom with it, so that a rank that failed only because
// a peer went first is not taken for the root cause.
type PeerError struct {
	Rank int
	Kind string // PeerClosed, PeerLost or PeerAborted
	Err  error
}

func (e *PeerError) Error() string { return e.Err.Error() }
func (e *PeerError) Unwrap() error { return e.Err }

// peerError is err as a failure that peer caused.
func peerError(peer int, kind string, err error) error {
	return &PeerError{Rank: peer, Kind: kind, Err: err}
}

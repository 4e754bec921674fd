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
// hosts' lowest ranks, then back within each host (hier.go). Connect
// chooses which of the three carries a Comm's data once (carrier.go), and
// the Comm never asks again. Broadcast copies one rank's buffer into the
// others' over the same carrier: along the ring from the root
// (ring_broadcast.go), from the root's memory over shared memory, or
// through the hosts' leaders.
//
// A Comm runs three goroutines of its own: one receives from the
// predecessor (it also notices when the predecessor goes away between
// collectives), one watches the connection to the successor for the same
// reason, and one fails the Comm when a neighbour's host stops
// acknowledging (a link down: Config.LinkTimeout, linkwatch.go). The
// caller's goroutine sends. Any failure during a collective leaves the byte
// streams out of step, so the Comm aborts itself: Done is closed, and every
// later AllReduce fails at once with the first cause.
//
// Errors wrap the kinds of package failure with the rank, the peer and the
// step: failure.ErrTimeout, ErrPeer, ErrMismatch, ErrInvalid (nothing was
// sent and the Comm is intact), and ErrAborted (Abort, Close, a cancelled
// context or an earlier failure; Close adds ErrClosed). A failure that a
// peer caused is a *failure.PeerError naming it. An error from an
// AllReduce issued on a Comm that had already failed wraps ErrAborted as
// well as the first cause.
package host

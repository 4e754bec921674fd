package host

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host/shm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// A job with several ranks on each of several hosts all-reduces
// hierarchically: the ranks of a host all-reduce through shared memory,
// the lowest rank of each host (its leader) all-reduces the host's sum with
// the other leaders over a TCP ring of their own, and each leader
// broadcasts the result to its host's ranks through shared memory. Between
// hosts each byte then crosses the network 2(H-1)/H times for H hosts,
// where the flat ring over all n ranks sends it 2(n-1)/n times over every
// host's link, and within a host no byte goes through the kernel's TCP
// stack. Every rank ends with its leader's bytes, which every leader
// computed alike (the ring's results are bit-identical), so every rank is
// bit-identical to every other. The full ring stays connected, carrying no
// data, to notice a rank that goes away.

// hosts groups the ranks by HostID: hosts[i] lists the ranks of host i in
// increasing order, hosts ordered by their lowest rank, and hostOf[r] is
// rank r's host.
func hosts(peers []PeerInfo) (groups [][]int, hostOf []int) {
	index := map[string]int{}
	hostOf = make([]int, len(peers))
	for r, p := range peers {
		i, ok := index[p.HostID]
		if !ok {
			i = len(groups)
			index[p.HostID] = i
			groups = append(groups, nil)
		}
		groups[i] = append(groups[i], r)
		hostOf[r] = i
	}
	return groups, hostOf
}

// hierarchical reports whether peers span several hosts with more than one
// rank on at least one, every host known: the case for a hierarchy.
func hierarchical(peers []PeerInfo) bool {
	for _, p := range peers {
		if p.HostID == "" {
			return false
		}
	}
	groups, _ := hosts(peers)
	if len(groups) < 2 {
		return false
	}
	for _, g := range groups {
		if len(g) > 1 {
			return true
		}
	}
	return false
}

// hierarchy is one rank's part in it, and the carrier of its Comm.
type hierarchy struct {
	rank    int       // this rank, for errors
	local   *shm.Comm // this host's ranks; nil when the rank is alone on its host
	cross   *Comm     // the leaders' ring; nil unless this rank leads its host
	leaders []int     // leaders[i]: the rank that leads host i
	members []int     // this host's ranks: local rank i is rank members[i]
	hostOf  []int     // hostOf[r]: rank r's host
	world   int
	seg     int // pipeline segment, bytes (defaultPipeSeg; tests make it small)
}

// defaultPipeSeg is the piece of a buffer that one pass of the pipeline
// moves: large enough that each stage's per-collective cost is noise (4 MiB
// is 34 ms on a 1 Gbit/s link, 0.3 ms at 100 Gbit/s), small enough that a
// 16 MiB bucket fills the pipeline.
const defaultPipeSeg = 4 << 20

var _ carrier = (*hierarchy)(nil)

func (h *hierarchy) route() route {
	return route{transport: "hierarchical", singleCopy: h.local != nil && h.local.Direct()}
}

// allReduce runs one all-reduce through the hierarchy (pipeline).
func (h *hierarchy) allReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	if err := h.pipeline(ctx, buf, dt, op); err != nil {
		return fmt.Errorf("all-reduce on rank %d: %w", h.rank, err)
	}
	return nil
}

// pipeline moves the buffer through the hierarchy a segment at a
// time: segment k's all-reduce within the host, segment k-1's broadcast
// from the leader, while the leader's ring works on segment k-1 (so
// neither the host's shared memory nor the link between hosts waits for the
// other). Every rank of a host runs the same shared-memory collectives in
// the same order, whatever the ring does; a leader broadcasts a segment
// only once the ring has finished it. Avg is a sum until the leaders divide
// the total by the world size, as the flat paths do.
func (h *hierarchy) pipeline(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	seg := max(1, h.seg/dt.Size()) * dt.Size()
	var parts [][]byte
	for off := 0; off < len(buf) || off == 0; off += seg {
		parts = append(parts, buf[off:min(off+seg, len(buf))])
	}
	var ring *pipeRing
	if h.cross != nil {
		ring = h.startRing(ctx, dt, op)
		defer ring.stop()
	}
	for k := 0; k <= len(parts); k++ {
		if k < len(parts) {
			if h.local != nil {
				if err := h.local.AllReduce(ctx, parts[k], dt, reduce.Sum); err != nil {
					return h.localError("within the host", err)
				}
			}
			if ring != nil {
				ring.todo <- parts[k]
			}
		}
		if k == 0 {
			continue
		}
		if ring != nil {
			if err := <-ring.done; err != nil {
				return h.crossError(err)
			}
		}
		if h.local != nil {
			if err := h.local.Broadcast(ctx, [][]byte{parts[k-1]}, dt, 0); err != nil {
				return h.localError("from the host's leader", err)
			}
		}
	}
	return nil
}

// broadcast hands root's buffers to root's host through shared memory, then
// from that host's leader to the other leaders over their ring, and from
// each of them to its host. Unlike the all-reduce it does not pipeline:
// its one use, a re-formation's state, moves once.
func (h *hierarchy) broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error {
	rootHost, here := h.hostOf[root], h.hostOf[h.rank]
	if here == rootHost && h.local != nil {
		if err := h.local.Broadcast(ctx, bufs, dt, slices.Index(h.members, root)); err != nil {
			return fmt.Errorf("broadcast on rank %d: %w", h.rank, h.localError("within the root's host", err))
		}
	}
	if h.cross != nil {
		if err := h.cross.Broadcast(ctx, bufs, dt, rootHost); err != nil {
			return fmt.Errorf("broadcast on rank %d: %w", h.rank, h.crossError(err))
		}
	}
	if here != rootHost && h.local != nil {
		if err := h.local.Broadcast(ctx, bufs, dt, 0); err != nil {
			return fmt.Errorf("broadcast on rank %d: %w", h.rank, h.localError("from the host's leader", err))
		}
	}
	return nil
}

// pipeRing runs the leaders' ring on the segments sent to todo, one after
// another, saying how each ended on done (one value each, in order).
type pipeRing struct {
	todo   chan []byte
	done   chan error
	cancel context.CancelFunc
	exited chan struct{}
}

// startRing starts a leader's ring worker for one all-reduce; stop ends it
// and waits for it, so that no segment of the buffer is in flight when
// pipeline returns.
func (h *hierarchy) startRing(ctx context.Context, dt reduce.DType, op reduce.Op) *pipeRing {
	ctx, cancel := context.WithCancel(ctx)
	r := &pipeRing{todo: make(chan []byte, 1), done: make(chan error, 1), cancel: cancel, exited: make(chan struct{})}
	go func() {
		defer close(r.exited)
		for {
			var part []byte
			select {
			case part = <-r.todo:
			case <-ctx.Done():
				return
			}
			err := h.cross.AllReduce(ctx, part, dt, reduce.Sum)
			if err == nil && op == reduce.Avg {
				reduce.Div(dt, part, h.world)
			}
			select {
			case r.done <- err:
			case <-ctx.Done():
				return
			}
		}
	}()
	return r
}

func (r *pipeRing) stop() {
	r.cancel()
	<-r.exited
}

// localError says which rank a failure within the host came from: the
// segment's ranks are local ranks.
func (h *hierarchy) localError(what string, err error) error {
	err = fmt.Errorf("%s (shared memory, whose rank i is rank members[i] of %v): %w", what, h.members, err)
	var pe *failure.PeerError
	if errors.As(err, &pe) && pe.Rank >= 0 && pe.Rank < len(h.members) {
		return failure.Peer(h.members[pe.Rank], pe.Kind, fromSHM(err))
	}
	return fromSHM(err)
}

// crossError says which rank a failure of the leaders' ring came from: its
// ranks are host numbers.
func (h *hierarchy) crossError(err error) error {
	err = fmt.Errorf("between hosts (the leaders' ring, whose rank i is host i, led by rank leaders[i] of %v): %w", h.leaders, err)
	var pe *failure.PeerError
	if errors.As(err, &pe) && pe.Rank >= 0 && pe.Rank < len(h.leaders) {
		return failure.Peer(h.leaders[pe.Rank], pe.Kind, err)
	}
	return err
}

// abort fails the hierarchy's collectives on this rank and, through the
// shared segment's abort flag, on the host's other ranks.
func (h *hierarchy) abort(err error) {
	if h.local != nil {
		h.local.Abort(err)
	}
	if h.cross != nil {
		h.cross.Abort(err)
	}
}

func (h *hierarchy) close() {
	if h.cross != nil {
		h.cross.Close()
	}
	if h.local != nil {
		h.local.Close()
	}
}

// newHierarchy makes rank's part of the hierarchy from its host's segment
// (nil when alone on its host); a leader also connects the leaders' ring.
// On error it has closed local.
func newHierarchy(ctx context.Context, e *Endpoint, rank int, peers []PeerInfo, local *shm.Comm, cfg Config) (*hierarchy, error) {
	groups, hostOf := hosts(peers)
	h := &hierarchy{rank: rank, local: local, world: len(peers), members: groups[hostOf[rank]], hostOf: hostOf, seg: defaultPipeSeg}
	for _, g := range groups {
		h.leaders = append(h.leaders, g[0])
	}
	if host := hostOf[rank]; groups[host][0] == rank {
		cross, err := connectLeaders(ctx, e, rank, peers, groups, host, cfg)
		if err != nil {
			if local != nil {
				local.Close()
			}
			return nil, err
		}
		h.cross = cross
	}
	cfg.Logger.Debug("host: hierarchical", "rank", rank, "hosts", len(groups), "leader", h.cross != nil, "local", local != nil)
	return h, nil
}

// connectLeaders builds the leaders' ring on the endpoint's listener, after
// the full ring: the leader of host i dials the leader of host i+1 and
// accepts host i-1's, with the same handshake (global ranks). Every full
// ring connection has been accepted by then (the shared-memory tokens went
// around it), so the listener only sees leaders.
func connectLeaders(ctx context.Context, e *Endpoint, rank int, peers []PeerInfo, groups [][]int, host int, cfg Config) (*Comm, error) {
	nh := len(groups)
	prev, next := groups[(host+nh-1)%nh][0], groups[(host+1)%nh][0]
	type result struct {
		conn *net.TCPConn
		err  error
	}
	accepted, dialed := make(chan result, 1), make(chan result, 1)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		c, err := accept(ctx, e.ln, prev, len(peers), e.info.Nonce, cfg.Logger)
		accepted <- result{c, err}
	}()
	go func() {
		c, err := dial(ctx, peers[next], rank, len(peers), cfg.Logger)
		dialed <- result{c, err}
	}()
	var recv, send *net.TCPConn
	var errs []error
	for range 2 {
		select {
		case r := <-accepted:
			recv = r.conn
			if r.err != nil {
				errs = append(errs, fmt.Errorf("accept leader rank %d: %w", prev, r.err))
				cancel()
			}
		case r := <-dialed:
			send = r.conn
			if r.err != nil {
				errs = append(errs, fmt.Errorf("dial leader rank %d: %w", next, r.err))
				cancel()
			}
		}
	}
	err := errors.Join(errs...)
	for _, c := range []*net.TCPConn{recv, send} {
		if c != nil && err == nil {
			err = tune(c, cfg.LinkTimeout)
		}
	}
	if err != nil {
		for _, c := range []*net.TCPConn{recv, send} {
			if c != nil {
				c.Close()
			}
		}
		return nil, fmt.Errorf("leaders' ring: %w", err)
	}
	return newComm(host, nh, send, recv, newRingCarrier, cfg), nil
}

package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host/shm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// sameHost reports whether every peer reported the same, known HostID.
func sameHost(peers []PeerInfo) bool {
	for _, p := range peers {
		if p.HostID == "" || p.HostID != peers[0].HostID {
			return false
		}
	}
	return true
}

// setupLocal tries to put the ranks of each host on a shared-memory segment
// of their own (one segment for the whole job when it runs on one host),
// agreeing over the freshly connected full ring, before the Comm's
// goroutines use it:
//
//  1. a token goes around the ring from rank 0; each host's lowest rank
//     (its leader, always reached first) creates
//     /dev/shm/ddpshim-<leader's nonce>, the host's other ranks map it,
//     each only if the token says every rank before it did, and passes on
//     whether it did too (a rank alone on its host has nothing to map);
//  2. when the token is back, every rank that will ever map a segment has:
//     rank 0 sends the verdict around once more, and each leader unlinks
//     its segment's name once it knows (rank 0 at once).
//
// All ranks use their host's segment, or none does (ok false: the ring
// carries the data); an error means the ring itself failed. Then the ranks
// of each segment decide on its single-copy path. It blocks until ctx is
// done at the longest.
func setupLocal(ctx context.Context, send, recv *net.TCPConn, rank int, peers []PeerInfo, cfg Config) (local *shm.Comm, ok bool, err error) {
	size := len(peers)
	groups, hostOf := hosts(peers)
	group := groups[hostOf[rank]]
	leader, localRank := group[0], 0
	for i, r := range group {
		if r == rank {
			localRank = i
		}
	}
	dl, _ := ctx.Deadline()
	send.SetDeadline(dl)
	recv.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() {
		send.SetDeadline(time.Unix(1, 0))
		recv.SetDeadline(time.Unix(1, 0))
	})
	path := "/dev/shm/ddpshim-" + peers[leader].Nonce
	scfg := shm.Config{Timeout: cfg.Timeout}
	var why error // why this rank did not map the segment
	unlinked := false
	unlink := func() {
		if local != nil && rank == leader && !unlinked {
			unlinked = true
			if uerr := shm.Unlink(path); uerr != nil {
				cfg.Logger.Warn("host: shared memory", "err", uerr)
			}
		}
	}
	ok = true     // every rank so far mapped its segment
	if rank > 0 { // round 1
		ok, err = readToken(recv)
	}
	if err == nil && ok && len(group) > 1 {
		if rank == leader {
			local, why = shm.Create(path, len(group), scfg)
		} else {
			local, why = shm.Open(path, localRank, len(group), scfg)
		}
		ok = local != nil
	}
	if err == nil {
		err = writeToken(send, ok)
	}
	if rank == 0 {
		if err == nil {
			ok, err = readToken(recv) // every rank's
		}
		unlink()
	}
	if err == nil && rank > 0 { // round 2
		ok, err = readToken(recv)
	}
	unlink()
	if err == nil && rank < size-1 {
		err = writeToken(send, ok)
	}
	if !stop() || ctx.Err() != nil { // the deadlines may have been cut short
		err = ctxError(ctx, err)
	}
	send.SetDeadline(time.Time{})
	recv.SetDeadline(time.Time{})
	if err != nil || !ok {
		if local != nil {
			local.Close()
		}
		if err != nil {
			return nil, false, err
		}
		level := slog.LevelDebug // another rank could not map it
		if why != nil {
			level = slog.LevelWarn
		}
		cfg.Logger.Log(ctx, level, "host: shared memory unavailable, the TCP ring carries the data", "rank", rank, "err", why)
		return nil, false, nil
	}
	if local == nil {
		return nil, true, nil // alone on its host
	}
	// Every rank of the segment has mapped it: decide on the single-copy path.
	direct, err := local.Negotiate(ctx)
	if err != nil {
		local.Close()
		return nil, false, fmt.Errorf("shared-memory setup: %w", fromSHM(err))
	}
	if !direct {
		level := slog.LevelDebug // another rank cannot
		if local.WhyStaged() != nil {
			level = slog.LevelInfo
		}
		cfg.Logger.Log(ctx, level, "host: shared memory without single copy: large all-reduces copy through the segment",
			"rank", rank, "err", local.WhyStaged())
	}
	return local, true, nil
}

// shmCarrier is the carrier when every rank is on one host: the data goes
// through the host's shared-memory segment, whose ranks are the Comm's.
type shmCarrier struct{ local *shm.Comm }

var _ carrier = shmCarrier{}

func (s shmCarrier) allReduce(ctx context.Context, buf []byte, dt reduce.DType, op reduce.Op) error {
	return fromSHM(s.local.AllReduce(ctx, buf, dt, op))
}

func (s shmCarrier) broadcast(ctx context.Context, bufs [][]byte, dt reduce.DType, root int) error {
	return fromSHM(s.local.Broadcast(ctx, bufs, dt, root))
}

// abort fails the segment's collectives here and, through its abort flag,
// on the peers.
func (s shmCarrier) abort(err error) { s.local.Abort(err) }

func (s shmCarrier) close() { s.local.Close() }

func (s shmCarrier) route() route {
	return route{transport: "shm", singleCopy: s.local.Direct()}
}

func writeToken(c *net.TCPConn, ok bool) error {
	b := []byte{'N'}
	if ok {
		b[0] = 'Y'
	}
	if _, err := c.Write(b); err != nil {
		return fmt.Errorf("shared-memory setup: %w: %w", classify(err), err)
	}
	return nil
}

func readToken(c *net.TCPConn) (bool, error) {
	var b [1]byte
	if _, err := io.ReadFull(c, b[:]); err != nil {
		return false, fmt.Errorf("shared-memory setup: %w: %w", classify(err), err)
	}
	switch b[0] {
	case 'Y':
		return true, nil
	case 'N':
		return false, nil
	}
	return false, fmt.Errorf("shared-memory setup: %w: token %q", failure.ErrPeer, b[0])
}

// fromSHM makes shared memory's own closed communicator (its Close, which
// only this Comm calls) an abort of this Comm, as the Comm's own Close is:
// ErrAborted is what a failed Comm's errors wrap.
func fromSHM(err error) error {
	if errors.Is(err, failure.ErrClosed) && !errors.Is(err, failure.ErrAborted) {
		return fmt.Errorf("%w: %w", failure.ErrAborted, err)
	}
	return err
}

package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"time"

	"github.com/ddp-agent/ddp-agent/ncclshim/host/shm"
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

// setupLocal tries to put every rank of a one-host ring on a shared-memory
// segment, agreeing over the freshly connected ring, before the Comm's
// goroutines use it:
//
//  1. rank 0 creates /dev/shm/ddpshim-<rank 0's nonce> and sends a token
//     around the ring; each rank maps the segment if the token says every
//     rank before it did, and passes on whether it did too;
//  2. when the token is back, rank 0 unlinks the name (every rank that will
//     ever map it has) and sends the verdict around once more.
//
// All ranks use the segment, or none does (nil, nil: the ring carries the
// data); an error means the ring itself failed. It blocks until ctx is done
// at the longest.
func setupLocal(ctx context.Context, send, recv *net.TCPConn, rank, size int, nonce string, cfg Config) (*shm.Comm, error) {
	dl, _ := ctx.Deadline()
	send.SetDeadline(dl)
	recv.SetDeadline(dl)
	stop := context.AfterFunc(ctx, func() {
		send.SetDeadline(time.Unix(1, 0))
		recv.SetDeadline(time.Unix(1, 0))
	})
	path := "/dev/shm/ddpshim-" + nonce
	scfg := shm.Config{Timeout: cfg.Timeout}
	var local *shm.Comm
	var why error  // why this rank did not map the segment
	var err error  // the ring failed
	ok := true     // every rank so far mapped the segment
	if rank == 0 { // round 1
		local, why = shm.Create(path, size, scfg)
	} else if ok, err = readToken(recv); err == nil && ok {
		local, why = shm.Open(path, rank, size, scfg)
	}
	ok = ok && local != nil
	if err == nil {
		err = writeToken(send, ok)
	}
	if rank == 0 {
		if err == nil {
			ok, err = readToken(recv) // every rank's
		}
		if local != nil {
			if uerr := shm.Unlink(path); uerr != nil {
				cfg.Logger.Warn("host: shared memory", "err", uerr)
			}
		}
	}
	if err == nil && rank > 0 { // round 2
		ok, err = readToken(recv)
	}
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
			return nil, err
		}
		level := slog.LevelDebug // another rank could not map it
		if why != nil {
			level = slog.LevelWarn
		}
		cfg.Logger.Log(ctx, level, "host: shared memory unavailable, the TCP ring carries the data", "rank", rank, "err", why)
		return nil, nil
	}
	// Every rank has mapped the segment: decide on the single-copy path.
	direct, err := local.Negotiate(ctx)
	if err != nil {
		local.Close()
		return nil, fmt.Errorf("shared-memory setup: %w", fromSHM(err))
	}
	if !direct {
		level := slog.LevelDebug // another rank cannot
		if local.WhyStaged() != nil {
			level = slog.LevelInfo
		}
		cfg.Logger.Log(ctx, level, "host: shared memory without single copy: large all-reduces copy through the segment",
			"rank", rank, "err", local.WhyStaged())
	}
	return local, nil
}

// SingleCopy reports whether large all-reduces take shared memory's
// single-copy path (cross-memory attach, package shm's direct.go).
func (c *Comm) SingleCopy() bool { return c.local != nil && c.local.Direct() }

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
	return false, fmt.Errorf("shared-memory setup: %w: token %q", ErrPeer, b[0])
}

// fromSHM makes an error of package shm match this package's sentinels too.
func fromSHM(err error) error {
	for _, m := range []struct{ from, to error }{
		{shm.ErrMismatch, ErrMismatch},
		{shm.ErrTimeout, ErrTimeout},
		{shm.ErrPeer, ErrPeer},
		{shm.ErrAborted, ErrAborted},
		{shm.ErrClosed, ErrAborted},
	} {
		if errors.Is(err, m.from) && !errors.Is(err, m.to) {
			err = fmt.Errorf("%w: %w", m.to, err)
			break
		}
	}
	var pe *shm.PeerError
	if errors.As(err, &pe) {
		return peerError(pe.Rank, pe.Kind, err)
	}
	return err
}

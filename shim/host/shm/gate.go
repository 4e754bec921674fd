package shm

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// The single copy's gate: a rank writes into a peer's buffer only while
// that peer is in the same collective, and a peer leaves only once no write
// into its buffer is under way.
//
// Rank r's gate word holds the ring step of the single-copy collective it is
// in (any other value: closed); its writing word holds 1+q while it writes
// into rank q's buffer, else 0. A writer stores writing and then loads the
// target's gate; a leaving rank stores its gate and then loads every peer's
// writing. The atomics are sequentially consistent, so at least one of the
// two sees the other's store: either the writer sees the gate closed and
// does not write, or the leaving rank sees the write and waits for it.

// gateWait bounds how long a leaving rank waits for a live peer's write
// already under way: one piece (directBounce, copyPiece), a millisecond or
// less unless the writer is stopped.
const gateWait = 10 * time.Second

// openGate lets peers write into this rank's buffer during step.
func (c *Comm) openGate(step uint32) {
	atomic.StoreUint32(c.ctl[c.rank].gate, step)
}

// closeGate shuts this rank's gate and waits until no peer is writing into
// its buffer, so that the caller may reuse it. After a collective that
// succeeded no peer is (every one said done); after one that failed, a peer
// may be in the middle of a piece.
func (c *Comm) closeGate(j *job) error {
	atomic.StoreUint32(c.ctl[c.rank].gate, j.base) // never the collective's step, base+1
	var deadline time.Time
	for p := range c.world {
		if p == c.rank {
			continue
		}
		for atomic.LoadUint32(c.ctl[p].writing) == uint32(c.rank)+1 {
			if deadline.IsZero() {
				deadline = time.Now().Add(gateWait)
			}
			pid := int(atomic.LoadUint32(c.ctl[p].pid))
			if gone(pid) {
				break // a dead writer writes no more
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%w: rank %d (pid %d) is still writing into this rank's buffer after %v; the buffer may change",
					failure.ErrPeer, p, pid, gateWait)
			}
			time.Sleep(50 * time.Microsecond)
		}
	}
	return nil
}

// writePeer runs write, which writes into peer p's buffers, if p is still
// in the collective of ring step step.
func (c *Comm) writePeer(p peer, step uint32, write func() error) error {
	writing := c.ctl[c.rank].writing
	atomic.StoreUint32(writing, uint32(p.rank)+1)
	defer atomic.StoreUint32(writing, 0)
	if atomic.LoadUint32(c.ctl[p.rank].gate) != step {
		return leftCollective(p)
	}
	if err := write(); err != nil {
		return c.peerMemError(p, err)
	}
	return nil
}

// leftCollective is the error of a rank that finds peer p's gate closed.
func leftCollective(p peer) error {
	return &failure.PeerError{Rank: p.rank, Kind: failure.PeerAborted,
		Err: fmt.Errorf("%w: rank %d left the collective", failure.ErrPeer, p.rank)}
}

// gone reports whether process pid has exited: it no longer exists, or it
// is a zombie, whose threads run no more.
func gone(pid int) bool {
	if err := unix.Kill(pid, 0); errors.Is(err, unix.ESRCH) {
		return true
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return errors.Is(err, os.ErrNotExist)
	}
	// The state follows the command's closing parenthesis.
	s := string(stat)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] == 'Z' || s[i+2] == 'X'
	}
	return false
}

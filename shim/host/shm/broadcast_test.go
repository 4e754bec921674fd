package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestBroadcast: every root's buffer reaches every rank bit for bit, staged
// (over several ring entries, wrapping the slot) and single copy, with
// all-reduces in between on the same communicators. Each rank cuts its
// buffer into pieces its own way (pieces), an empty one among them: the
// bytes go in order whatever the cuts. The largest count is big enough on
// every world for the root to write its part into the others (pushCut).
func TestBroadcast(t *testing.T) {
	for _, world := range []int{1, 2, 3, 4} {
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("world%d/direct=%v", world, direct), func(t *testing.T) {
				t.Parallel()
				cfg := Config{SlotBytes: 64 << 10, Timeout: time.Minute, DirectMin: -1}
				if direct {
					cfg.DirectMin = 1
				}
				comms := newGroup(t, world, cfg)
				negotiate(t, comms)
				salt := 0
				for _, count := range []int{0, 1, 1037, 300000, 700001} {
					for root := range world {
						salt++
						bufs := make([][]byte, world)
						errs := allRanks(comms, func(r int, c *Comm) error {
							bufs[r] = inputs(reduce.BFloat16, r, count, salt)
							return c.Broadcast(context.Background(), pieces(bufs[r], 2*(1+r*131), 2*(7001+r*1999)), reduce.BFloat16, root)
						})
						want := inputs(reduce.BFloat16, root, count, salt)
						for r, err := range errs {
							if err != nil {
								t.Fatalf("count %d, root %d, rank %d: %v", count, root, r, err)
							}
							if !bytes.Equal(bufs[r], want) {
								t.Fatalf("count %d, root %d: rank %d's buffer is not the root's", count, root, r)
							}
						}
						got := runAll(t, comms, reduce.Float32, reduce.Sum, count/3, salt)
						checkResult(t, reduce.Float32, reduce.Sum, got, salt)
					}
				}
			})
		}
	}
}

// pieces cuts b after its first first bytes, leaves an empty buffer
// there, and cuts the rest every every bytes.
func pieces(b []byte, first, every int) [][]byte {
	first = min(first, len(b))
	out := [][]byte{b[:first], {}}
	for rest := b[first:]; len(rest) > 0; rest = rest[min(every, len(rest)):] {
		out = append(out, rest[:min(every, len(rest))])
	}
	return out
}

// TestBroadcastMismatch: ranks that disagree on the collective (a broadcast
// against an all-reduce, or two roots) fail with failure.ErrMismatch instead of
// exchanging data.
func TestBroadcastMismatch(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(r int, c *Comm, buf []byte) error
	}{
		{"broadcast/all-reduce", func(r int, c *Comm, buf []byte) error {
			if r == 0 {
				return c.Broadcast(context.Background(), [][]byte{buf}, reduce.Float32, 0)
			}
			return c.AllReduce(context.Background(), buf, reduce.Float32, reduce.Sum)
		}},
		{"roots", func(r int, c *Comm, buf []byte) error {
			return c.Broadcast(context.Background(), [][]byte{buf}, reduce.Float32, r%2)
		}},
	} {
		for _, direct := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/direct=%v", tc.name, direct), func(t *testing.T) {
				cfg := Config{Timeout: 10 * time.Second, DirectMin: -1}
				if direct {
					cfg.DirectMin = 1
				}
				comms := newGroup(t, 2, cfg)
				negotiate(t, comms)
				errs := allRanks(comms, func(r int, c *Comm) error { return tc.run(r, c, make([]byte, 4096)) })
				for r, err := range errs {
					if !errors.Is(err, failure.ErrMismatch) {
						t.Errorf("rank %d: got %v, want failure.ErrMismatch", r, err)
					}
				}
			})
		}
	}
}

// TestDirectBroadcastPushStops: the root writes its share a piece at a
// time and looks at its deadline and abort flag before each piece, so a
// broadcast past its deadline writes nothing more into a peer, where one
// write of the whole share ignored both. The peer is in the broadcast (its
// gate open, its table published) when the root's push runs with a
// deadline that has passed.
func TestDirectBroadcastPushStops(t *testing.T) {
	const size = 8 << 20 // the root's share: 4 MiB, one piece
	comms := newGroup(t, 2, Config{Timeout: time.Minute, DirectMin: 1})
	negotiate(t, comms)
	root, theirs := inputs(reduce.Float32, 0, size/4, 1), inputs(reduce.Float32, 1, size/4, 1)
	before := bytes.Clone(theirs)
	done := make(chan error, 1)
	go func() { done <- comms[1].Broadcast(context.Background(), [][]byte{theirs}, reduce.Float32, 0) }()
	for atomic.LoadUint32(comms[1].ctl[1].in) == 0 { // its table and gate are there
		time.Sleep(100 * time.Microsecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	j := &job{ctx: ctx, deadline: time.Now().Add(-time.Second), ctxDeadline: true, vec: vec{root}, size: size}
	p := peer{rank: 1, pid: int(atomic.LoadUint32(comms[0].ctl[1].pid)), addr: uintptr(atomic.LoadUint64(comms[0].ctl[1].addr))}
	err := comms[0].pushPart(j, p, atomic.LoadUint32(comms[0].ctl[1].gate), pushCut(size, 2, comms[0].pushMin))
	comms[0].Abort(nil) // lets the peer go
	if !errors.Is(err, failure.ErrTimeout) {
		t.Errorf("the push past its deadline: %v, want a timeout", err)
	}
	t.Logf("push: %v; peer: %v", err, <-done)
	if !bytes.Equal(theirs, before) {
		t.Errorf("the push past its deadline wrote into the peer's buffer")
	}
}

// TestDirectBroadcastBlame: a root that finds a peer gone from the
// collective names the rank that failed first (the abort flag's), not the
// peer that left because of it.
func TestDirectBroadcastBlame(t *testing.T) {
	const size = 4 << 20 // a share for each of 2 peers
	comms := newGroup(t, 3, Config{Timeout: time.Minute, DirectMin: 1})
	negotiate(t, comms)
	// Ranks 1 and 2 enter; rank 2 times out waiting for the root, raising
	// the flag, and rank 1 leaves for it. Then the root comes.
	errs := allRanks(comms[1:], func(r int, c *Comm) error {
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if r == 1 {
			ctx, cancel = context.WithTimeout(ctx, 10*time.Millisecond)
		}
		defer cancel()
		return c.Broadcast(ctx, [][]byte{make([]byte, size)}, reduce.Float32, 0)
	})
	if !errors.Is(errs[1], failure.ErrTimeout) || errs[0] == nil {
		t.Fatalf("rank 1: %v; rank 2: %v; want rank 2 timed out, rank 1 failed", errs[0], errs[1])
	}
	err := comms[0].Broadcast(context.Background(), [][]byte{make([]byte, size)}, reduce.Float32, 0)
	var pe *failure.PeerError
	if !errors.As(err, &pe) || pe.Rank != 2 {
		t.Fatalf("root: %v, want rank 2's failure named", err)
	}
	t.Logf("root: %v", err)
}

// TestDeadlinePassedOnEntry: a collective called with a deadline that has
// already passed is a timeout, as one that passes inside it is; CI once
// saw a slow goroutine of TestDirectBroadcastBlame enter late and report a
// bare context error, which callers do not count as a timeout.
func TestDeadlinePassedOnEntry(t *testing.T) {
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	for _, call := range []struct {
		name string
		run  func(*Comm) error
	}{
		{"all-reduce", func(c *Comm) error { return c.AllReduce(ctx, make([]byte, 64), reduce.Float32, reduce.Sum) }},
		{"broadcast", func(c *Comm) error { return c.Broadcast(ctx, [][]byte{make([]byte, 64)}, reduce.Float32, 0) }},
	} {
		comms := newGroup(t, 2, Config{Timeout: time.Minute})
		if err := call.run(comms[0]); !errors.Is(err, failure.ErrTimeout) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v, want a timeout", call.name, err)
		}
	}
}

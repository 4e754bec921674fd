package shm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
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

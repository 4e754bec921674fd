package host

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/host/shm"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// TestBroadcast: every carrier (the TCP ring, shared memory, the hierarchy
// with hosts of unequal size and interleaved ranks) broadcasts from every
// root, counts that fill no segment, one, and many (staged and single
// copy), every rank ending with the root's bytes; all-reduces between the
// broadcasts still agree, so the framing stays in step. Each rank passes
// its bytes cut into buffers its own way (cutAt), empty ones too.
func TestBroadcast(t *testing.T) {
	for _, tc := range []struct {
		name      string
		n         int
		cfg       Config
		layout    []int // hosts; nil: one host
		transport string
	}{
		{"tcp 1", 1, Config{}, nil, "tcp"},
		{"tcp 2", 2, Config{}, nil, "tcp"},
		{"tcp 4 small segments", 4, Config{SegmentBytes: 4 << 10}, nil, "tcp"},
		{"shm 3", 3, Config{SHM: true}, nil, "shm"},
		{"hierarchical 2x2", 4, Config{SHM: true}, []int{0, 0, 1, 1}, "hierarchical"},
		{"hierarchical interleaved", 5, Config{SHM: true}, []int{0, 1, 0, 1, 2}, "hierarchical"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.Timeout = 30 * time.Second
			var edit func([]PeerInfo)
			if tc.layout != nil {
				edit = onHosts(tc.layout...)
			}
			comms := connectWith(t, tc.n, tc.cfg, edit)
			if got := comms[0].Transport(); got != tc.transport {
				t.Fatalf("transport %q, want %q", got, tc.transport)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for root := range tc.n {
				for _, count := range []int{0, 1, 1037, 300_001} {
					bufs := make([][]byte, tc.n)
					for r := range bufs {
						bufs[r] = make([]byte, 4*count)
						for i := range bufs[r] {
							bufs[r][i] = byte(rng.Uint32())
						}
					}
					want := bytes.Clone(bufs[root])
					errs := each(tc.n, func(r int) error {
						return comms[r].Broadcast(t.Context(), cutAt(bufs[r], 4*(r*97+1), 4*(r*5003+11)), reduce.Float32, root)
					})
					if err := errors.Join(errs...); err != nil {
						t.Fatalf("root %d, %d elements: %v", root, count, err)
					}
					for r := range bufs {
						if !bytes.Equal(bufs[r], want) {
							t.Fatalf("root %d, %d elements, rank %d: %s", root, count, r, firstDiff(reduce.Float32, bufs[r], want))
						}
					}
					checkAllReduce(t, comms, newInputs(tc.n, 1037), reduce.Float32, reduce.Sum)
				}
			}
		})
	}
}

// TestBroadcastMismatch: ranks that disagree on the root, or on whether a
// collective is a broadcast, fail promptly with failure.ErrMismatch naming
// both sides, over the ring and over shared memory, and every rank's Comm
// fails.
func TestBroadcastMismatch(t *testing.T) {
	for _, shm := range []bool{false, true} {
		for _, tc := range []struct {
			name  string
			other func(c *Comm, buf []byte) error
			says  string
		}{
			{"root", func(c *Comm, buf []byte) error { return c.Broadcast(t.Context(), [][]byte{buf}, reduce.Float32, 1) }, "broadcast from rank 1"},
			{"all-reduce", func(c *Comm, buf []byte) error { return c.AllReduce(t.Context(), buf, reduce.Float32, reduce.Sum) }, "sum"},
		} {
			t.Run(fmtBool(shm, "shm", "tcp")+" "+tc.name, func(t *testing.T) {
				comms := newRingSHM(t, 3, shm)
				start := time.Now()
				errs := each(3, func(r int) error {
					buf := make([]byte, 40)
					if r == 2 {
						return tc.other(comms[r], buf)
					}
					return comms[r].Broadcast(t.Context(), [][]byte{buf}, reduce.Float32, 0)
				})
				if el := time.Since(start); el > 5*time.Second {
					t.Errorf("took %v, want well under the 30s timeout", el)
				}
				// A receiver that needs nothing from the odd rank may
				// finish; its Comm fails with the others' all the same.
				named := false
				for r, err := range errs {
					t.Logf("rank %d: %v", r, err)
					if errors.Is(err, failure.ErrMismatch) && strings.Contains(err.Error(), tc.says) && strings.Contains(err.Error(), "broadcast from rank 0") {
						named = true
					}
				}
				if !named {
					t.Errorf("no failure.ErrMismatch naming both sides (%q and %q)", tc.says, "broadcast from rank 0")
				}
				for r, c := range comms {
					if err := c.AllReduce(t.Context(), make([]byte, 4), reduce.Float32, reduce.Sum); err == nil {
						t.Errorf("rank %d: an all-reduce after the mismatch succeeded", r)
					}
				}
			})
		}
	}
}

// TestBroadcastInvalid: a root outside the world or a buffer that is not a
// whole number of elements is failure.ErrInvalid and leaves the Comm intact.
func TestBroadcastInvalid(t *testing.T) {
	comms := newRing(t, 2, Config{Timeout: 30 * time.Second})
	for _, tc := range []struct {
		buf  []byte
		root int
	}{{make([]byte, 8), 2}, {make([]byte, 8), -1}, {make([]byte, 6), 0}} {
		if err := comms[0].Broadcast(t.Context(), [][]byte{tc.buf}, reduce.Float32, tc.root); !errors.Is(err, failure.ErrInvalid) {
			t.Errorf("%d bytes from %d: got %v, want failure.ErrInvalid", len(tc.buf), tc.root, err)
		}
	}
	checkAllReduce(t, comms, newInputs(2, 10), reduce.Float32, reduce.Sum)
}

// cutAt cuts b into buffers: the first first bytes, an empty one, then
// pieces of every bytes (both clipped to b).
func cutAt(b []byte, first, every int) [][]byte {
	first = min(first, len(b))
	out := [][]byte{b[:first], nil}
	for off := first; off < len(b); off += every {
		out = append(out, b[off:min(off+every, len(b))])
	}
	return out
}

func newRingSHM(t *testing.T, n int, shm bool) []*Comm {
	t.Helper()
	comms := newRing(t, n, Config{SHM: shm, Timeout: 30 * time.Second})
	want := fmtBool(shm, "shm", "tcp")
	if got := comms[0].Transport(); got != want {
		t.Fatalf("transport %q, want %q", got, want)
	}
	return comms
}

func fmtBool(b bool, yes, no string) string {
	if b {
		return yes
	}
	return no
}

// TestFirstFailureOverItsConsequence: a rank whose shared-memory
// collective failed first, telling its peers, returns that failure, even
// where its Comm recorded a consequence of it before: a peer that read it
// in shared memory closed its connection before this rank's collective
// returned (CI, under load: TestBroadcastMismatch's shm root, where the
// rank that found the mismatch said "connection to rank 0: EOF", and
// TestPeerKilled's shm 4 ranks, where the rank that found rank 2 dead
// said "read header from rank 0: EOF").
func TestFirstFailureOverItsConsequence(t *testing.T) {
	// A real first failure: two ranks of a segment disagree.
	path := filepath.Join(t.TempDir(), "seg")
	a, err := shm.Create(path, 2, shm.Config{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := shm.Open(path, 1, 2, shm.Config{Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	errs := each(2, func(r int) error {
		return []*shm.Comm{a, b}[r].AllReduce(t.Context(), make([]byte, 4*(10+r)), reduce.Float32, reduce.Sum)
	})
	first := slices.IndexFunc(errs, shm.RaisedFirst)
	if first < 0 {
		t.Fatalf("no rank failed first: %v", errs)
	}

	comms := newRing(t, 2, Config{Timeout: 30 * time.Second})
	eof := failure.Peer(1, failure.PeerLost, fmt.Errorf("rank 0: connection to rank 1: %w: EOF", failure.ErrPeer))
	err = comms[0].collective(t.Context(), "all-reduce", func() error {
		comms[0].fail(eof)
		return errs[first]
	})
	if err != errs[first] {
		t.Fatalf("got %v, want the first failure, %v", err, errs[first])
	}
	if got := comms[0].Err(); !errors.Is(got, eof) {
		t.Errorf("the Comm holds %v, want the first failure it recorded", got)
	}
	// Not a first failure: the Comm's own first is returned.
	comms = newRing(t, 2, Config{Timeout: 30 * time.Second})
	err = comms[0].collective(t.Context(), "all-reduce", func() error {
		comms[0].fail(eof)
		return errs[1-first]
	})
	if !errors.Is(err, eof) {
		t.Fatalf("got %v, want the Comm's first failure", err)
	}
}

package host

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// helperEnv switches the test binary into a helper rank process:
// "rank,size,count,segment,shm,broadcast".
const helperEnv = "DDP_HOST_TEST_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		os.Exit(helperRank(spec))
	}
	code := m.Run()
	if code == 0 {
		if err := leaktest.Check("shim/host", 5*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// helperRank is one rank in its own process. It prints its PeerInfo as a
// JSON line, reads everyone's as a JSON line, connects, starts an
// all-reduce of count float32s (or a broadcast of them from rank 0) and
// exits with status 3 in the middle of it (over shared memory, where the
// data moves too fast to catch, it exits while the others wait for it
// instead).
func helperRank(spec string) int {
	var rank, size, count, seg int
	var useSHM, broadcast bool
	if _, err := fmt.Sscanf(spec, "%d,%d,%d,%d,%t,%t", &rank, &size, &count, &seg, &useSHM, &broadcast); err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	ep, err := Listen(Options{Host: "127.0.0.1"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	info, _ := json.Marshal(ep.Info())
	fmt.Printf("%s\n", info)
	var peers []PeerInfo
	line, err := bufio.NewReader(os.Stdin).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &peers)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper: read peers:", err)
		return 2
	}
	c, err := Connect(context.Background(), ep, rank, peers, Config{Timeout: 20 * time.Second, SegmentBytes: seg, SHM: useSHM})
	if err != nil {
		fmt.Fprintln(os.Stderr, "helper:", err)
		return 2
	}
	if useSHM {
		time.Sleep(200 * time.Millisecond)
		return 3
	}
	errc := make(chan error, 1)
	go func() {
		if broadcast {
			errc <- c.Broadcast(context.Background(), [][]byte{make([]byte, 4*count)}, reduce.Float32, 0)
			return
		}
		errc <- c.AllReduce(context.Background(), make([]byte, 4*count), reduce.Float32, reduce.Sum)
	}()
	for c.received.n.Load() < 4 {
		select {
		case err := <-errc:
			fmt.Fprintln(os.Stderr, "helper: all-reduce ended before the exit:", err)
			return 4
		case <-time.After(time.Millisecond):
		}
	}
	return 3 // mid-ring, without closing anything
}

// TestPeerKilled: a rank whose process exits in the middle of an
// all-reduce, or of a broadcast it forwards, makes every other rank fail
// with failure.ErrPeer at once, long before the timeout. A broadcast's
// root is the exception: its part is done once its successor has
// received every segment (as NCCL's root is), which loopback can carry
// before the death is seen, its successor receiving while it forwards.
func TestPeerKilled(t *testing.T) {
	const (
		count   = 4 << 20 // float32s: 16 MiB
		seg     = 64 << 10
		timeout = 20 * time.Second
	)
	tests := []struct {
		name      string
		n, dead   int
		shm       bool
		broadcast bool // from rank 0; 16 MiB cannot all wait in the sockets' buffers
	}{
		{"2 ranks", 2, 1, false, false},
		{"3 ranks, middle", 3, 1, false, false},
		{"4 ranks, first", 4, 0, false, false},
		{"shared memory, 2 ranks", 2, 0, true, false},
		{"shared memory, 4 ranks", 4, 2, true, false},
		{"broadcast, 3 ranks, the root's successor", 3, 1, false, true},
		{"broadcast, 4 ranks, forwarding", 4, 2, false, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d,%d,%d,%d,%t,%t", helperEnv, tc.dead, tc.n, count, seg, tc.shm, tc.broadcast))
			cmd.Stderr = os.Stderr
			stdin, err := cmd.StdinPipe()
			if err != nil {
				t.Fatal(err)
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			var exitAt time.Time
			var exitErr error
			exited := make(chan struct{})
			defer func() {
				stdin.Close() // a helper still reading its peers gives up
				<-exited
			}()
			peers := make([]PeerInfo, tc.n)
			line, err := bufio.NewReader(stdout).ReadBytes('\n')
			if err == nil {
				err = json.Unmarshal(line, &peers[tc.dead])
			}
			go func() {
				exitErr = cmd.Wait()
				exitAt = time.Now()
				close(exited)
			}()
			if err != nil {
				t.Fatalf("helper's PeerInfo: %v", err)
			}
			eps := make([]*Endpoint, tc.n)
			for r := range tc.n {
				if r != tc.dead {
					if eps[r], err = Listen(Options{Host: "127.0.0.1"}); err != nil {
						t.Fatal(err)
					}
					peers[r] = eps[r].Info()
				}
			}
			all, _ := json.Marshal(peers)
			if _, err := fmt.Fprintf(stdin, "%s\n", all); err != nil {
				t.Fatal(err)
			}

			start := time.Now()
			failedAt := make([]time.Time, tc.n)
			errs := each(tc.n, func(r int) error {
				if r == tc.dead {
					return nil
				}
				c, err := Connect(t.Context(), eps[r], r, peers, Config{Timeout: timeout, SegmentBytes: seg, SHM: tc.shm})
				if err != nil {
					return fmt.Errorf("connect: %w", err)
				}
				t.Cleanup(func() { c.Close() }) // once every rank is done: a root that completed must not fail the others by closing
				if want := map[bool]string{false: "tcp", true: "shm"}[tc.shm]; c.Transport() != want {
					return fmt.Errorf("transport %q, want %q", c.Transport(), want)
				}
				if tc.broadcast {
					err = c.Broadcast(t.Context(), [][]byte{make([]byte, 4*count)}, reduce.Float32, 0)
				} else {
					err = c.AllReduce(t.Context(), make([]byte, 4*count), reduce.Float32, reduce.Sum)
				}
				failedAt[r] = time.Now()
				return err
			})
			<-exited
			if ee, ok := exitErr.(*exec.ExitError); !ok || ee.ExitCode() != 3 {
				t.Fatalf("helper: got %v, want exit status 3", exitErr)
			}
			for r, err := range errs {
				if r == tc.dead {
					continue
				}
				t.Logf("rank %d: %v", r, err)
				if tc.broadcast && r == 0 && err == nil {
					continue
				}
				if !errors.Is(err, failure.ErrPeer) {
					t.Errorf("rank %d: got %v, want failure.ErrPeer", r, err)
				}
				if d := failedAt[r].Sub(exitAt); d > 2*time.Second {
					t.Errorf("rank %d failed %v after the helper exited, want at once", r, d)
				}
				if d := failedAt[r].Sub(start); d > timeout/2 {
					t.Errorf("rank %d failed after %v, want well within the %v timeout", r, d, timeout)
				}
			}
			checkBlamesDead(t, errs, tc.dead)
		})
	}
}

// checkBlamesDead: every survivor's error is a failure.PeerError naming the dead
// rank or a survivor that failed before it, so that following them leads
// to the dead rank: what the agent relies on to name the root cause. A
// survivor that completed (nil, which the caller allowed) blames no one.
func checkBlamesDead(t *testing.T, errs []error, dead int) {
	t.Helper()
	blamed := map[int]int{}
	for r, err := range errs {
		var pe *failure.PeerError
		if r == dead || err == nil {
			continue
		}
		if !errors.As(err, &pe) || pe.Kind != failure.PeerLost && pe.Kind != failure.PeerAborted {
			t.Errorf("rank %d: got %v, want a failure.PeerError (lost or aborted)", r, err)
			return
		}
		blamed[r] = pe.Rank
	}
	for r := range blamed {
		p, hops := r, 0
		for ; p != dead && hops <= len(errs); hops++ {
			p = blamed[p]
		}
		if p != dead {
			t.Errorf("following the ranks that failed rank %d does not lead to the dead rank %d: %v", r, dead, blamed)
		}
	}
}

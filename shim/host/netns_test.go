package host

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/reduce"
)

// The tests in this file run every rank as a process of its own on a
// simulated host of a netLab, so the ring's bytes cross real (veth, bridge,
// rate-limited) links instead of loopback. The parent test coordinates:
// it passes each rank a netRankSpec, collects their PeerInfo, hands every
// rank the list, and reads their reports, one JSON line each.

// netRankEnv holds a netRankSpec as JSON in a rank process.
const netRankEnv = "DDP_HOST_NETNS_RANK"

// netLinkTimeout is Config.LinkTimeout in these tests: short, so that a
// cut link fails the ring quickly, and the matrix proves it does not fail
// a healthy link at its rate limit, with its queue full. Between
// collectives keepalive makes it 2 s (its least), so the two mechanisms of
// linkwatch.go are told apart by when they fire.
const netLinkTimeout = time.Second

type netRankSpec struct {
	Rank, Size int
	Host       string
	PerHost    int    // ranks on each host (0: 1), hosts told apart by hostname (netLab.command)
	SHM        bool   // Config.SHM: ranks on one host share memory, so with PerHost > 1 the all-reduce is hierarchical
	Job        string // "matrix" or "cut"
	Count      int    // float32s of the "cut" job's all-reduce
	LateRank   int    // in the matrix, this rank starts its largest collectives late...
	Late       time.Duration
}

// netReport is one line a rank prints, prefixed with netReportTag.
type netReport struct {
	Peer      *PeerInfo        `json:",omitempty"` // first: where it listens
	Case      int              `json:",omitempty"` // a matrix case's index + 1
	Sum       string           `json:",omitempty"` // sha256 of the case's result
	Transport string           `json:",omitempty"` // with Case: the Comm's Transport()
	Started   bool             `json:",omitempty"` // the cut job's all-reduce is moving data
	Err       string           `json:",omitempty"`
	IsPeer    bool             `json:",omitempty"` // Err wraps failure.ErrPeer
	PeerRank  int              // the failure.PeerError's rank, or -1
	PeerKind  failure.PeerKind `json:",omitempty"`
	At        time.Time        // when the report was made
}

const netReportTag = "NETRANK "

// matrixCase is one all-reduce of the matrix.
type matrixCase struct {
	count int
	dt    reduce.DType
	op    reduce.Op
}

// netMatrix is every dtype and op, at counts 0, 1, fewer than n, not
// divisible by n, and 4 MiB of float32.
func netMatrix(n int) []matrixCase {
	var cases []matrixCase
	for _, count := range []int{0, 1, n - 1, n + 1, 1037, 1<<20 + 3} {
		for _, dt := range reduce.DTypes {
			for _, op := range []reduce.Op{reduce.Sum, reduce.Avg} {
				cases = append(cases, matrixCase{count, dt, op})
			}
		}
	}
	return cases
}

// TestNetnsAllReduce runs the correctness matrix (as TestAllReduce's, bit
// for bit against a float64 reference) between 2 and 3 hosts on 2 Gbit/s
// links. In the 3-host ring the last rank starts its 4 MiB collectives
// 1.5 link timeouts after the others: its socket buffers fill up and its
// kernel answers zero-window probes, which must not count as a dead link.
func TestNetnsAllReduce(t *testing.T) {
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("hosts=%d", n), func(t *testing.T) {
			lab := newNetLab(t, n, 2000)
			spec := netRankSpec{Job: "matrix", LateRank: -1}
			if n == 3 {
				spec.LateRank, spec.Late = n-1, netLinkTimeout*3/2
			}
			checkNetMatrix(t, startNetRanks(t, lab, spec), "tcp")
		})
	}
}

// TestNetnsHierarchical runs the matrix with 2 ranks on each of 2 and 3
// hosts (2 Gbit/s links) and shared memory allowed, so the all-reduce is
// hierarchical: each host's ranks reduce in shared memory, their leaders
// over the ring between the hosts, and the result goes back through shared
// memory; bit for bit the reference on every rank.
func TestNetnsHierarchical(t *testing.T) {
	for _, hosts := range []int{2, 3} {
		t.Run(fmt.Sprintf("hosts=%d", hosts), func(t *testing.T) {
			lab := newNetLab(t, hosts, 2000)
			ranks := startNetRanks(t, lab, netRankSpec{Job: "matrix", LateRank: -1, PerHost: 2, SHM: true})
			checkNetMatrix(t, ranks, "hierarchical")
		})
	}
}

// checkNetMatrix reads every rank's reports of the matrix and compares each
// result with the reference, and the transport with want.
func checkNetMatrix(t *testing.T, ranks []*netRank, want string) {
	t.Helper()
	n := len(ranks)
	var in *inputs
	for i, mc := range netMatrix(n) {
		if in == nil || in.n != n || len(in.sumHalves) != mc.count {
			in = newInputs(n, mc.count)
		}
		sum := sha256.Sum256(in.want(mc.dt, mc.op))
		ref := hex.EncodeToString(sum[:])
		for r, rk := range ranks {
			rep := rk.next(t, 2*time.Minute)
			if rep.Err != "" {
				t.Fatalf("rank %d, count=%d/%v/%v: %s", r, mc.count, mc.dt, mc.op, rep.Err)
			}
			if rep.Case != i+1 || rep.Sum != ref {
				t.Fatalf("rank %d, count=%d/%v/%v: case %d, result sha256 %.12s, want case %d, %.12s (the reference)",
					r, mc.count, mc.dt, mc.op, rep.Case, rep.Sum, i+1, ref)
			}
			if rep.Transport != want {
				t.Fatalf("rank %d: transport %q, want %q", r, rep.Transport, want)
			}
		}
	}
	for r, rk := range ranks {
		if err := rk.wait(); err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestNetnsLinkDown cuts one host's link between 3 hosts on 200 Mbit/s
// links, in the middle of a 24 MiB all-reduce (about 1.3 s of traffic),
// and between collectives. Nothing is reset, yet every rank fails within
// its bound: the others with a failure.PeerError that names the cut rank, or a
// rank that failed before them because of it, and the cut rank itself
// too, rather than waiting for the minute-long Timeout (or, between
// collectives, for the next AllReduce). Mid-collective the senders'
// watcher fires within 1.25 link timeouts; between collectives only
// keepalive can, after 2 s. Both bounds leave half a second to spare.
func TestNetnsLinkDown(t *testing.T) {
	for _, tc := range []struct {
		name, job string
		most      time.Duration
	}{
		{"mid-collective", "cut", netLinkTimeout*5/4 + 500*time.Millisecond},
		{"between collectives", "idle", max(netLinkTimeout, 2*time.Second) + 500*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			linkDown(t, tc.job, tc.most)
		})
	}
}

func linkDown(t *testing.T, job string, most time.Duration) {
	const n, cutRank = 3, 1
	lab := newNetLab(t, n, 200)
	ranks := startNetRanks(t, lab, netRankSpec{Job: job, Count: 6 << 20})
	for r, rk := range ranks {
		if rep := rk.next(t, 30*time.Second); !rep.Started {
			t.Fatalf("rank %d: %+v, want started", r, rep)
		}
	}
	lab.cut(t, cutRank)
	cutAt := time.Now()
	errs := make([]error, n)
	for r, rk := range ranks {
		rep := rk.next(t, 30*time.Second)
		t.Logf("rank %d after %v: %s", r, rep.At.Sub(cutAt).Round(time.Millisecond), rep.Err)
		if rep.Err == "" {
			t.Fatalf("rank %d: no failure with rank %d's link cut", r, cutRank)
		}
		if d := rep.At.Sub(cutAt); d > most {
			t.Errorf("rank %d failed %v after the cut, want within %v", r, d, most)
		}
		if !rep.IsPeer {
			t.Errorf("rank %d: %s, want failure.ErrPeer", r, rep.Err)
		}
		if rep.PeerRank >= 0 {
			errs[r] = &failure.PeerError{Rank: rep.PeerRank, Kind: rep.PeerKind, Err: errors.New(rep.Err)}
		} else {
			errs[r] = errors.New(rep.Err)
		}
		if r != cutRank && !strings.Contains(rep.Err, fmt.Sprintf("rank %d", rep.PeerRank)) {
			t.Errorf("rank %d: message %q does not name rank %d", r, rep.Err, rep.PeerRank)
		}
		rk.wait()
	}
	checkBlamesDead(t, errs, cutRank)
}

// netRank is the parent's handle on one rank process.
type netRank struct {
	reports chan netReport
	stdin   io.WriteCloser
	exited  chan struct{} // closed when the process has exited...
	err     error         // ...with this
}

// startNetRanks starts one rank per host of lab, each with spec (its
// Rank, Size and Host filled in), and connects them: it returns once every
// rank has been sent everyone's PeerInfo.
func startNetRanks(t *testing.T, lab *netLab, spec netRankSpec) []*netRank {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	per := max(1, spec.PerHost)
	n := len(lab.hosts) * per
	ranks := make([]*netRank, n)
	peers := make([]PeerInfo, n)
	for r := range n {
		spec.Rank, spec.Size, spec.Host = r, n, lab.ips[r/per]
		js, _ := json.Marshal(spec)
		cmd := lab.command(r/per, per > 1, exe, "-test.run=^TestNetnsRank$", "-test.timeout=2m")
		cmd.Env = append(os.Environ(), netRankEnv+"="+string(js))
		cmd.Stderr = os.Stderr
		rk := &netRank{reports: make(chan netReport, 256), exited: make(chan struct{})}
		if rk.stdin, err = cmd.StdinPipe(); err != nil {
			t.Fatal(err)
		}
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			cmd.Process.Kill() // a rank the test gave up on
			<-rk.exited
		})
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				if line, ok := strings.CutPrefix(sc.Text(), netReportTag); ok {
					var rep netReport
					if err := json.Unmarshal([]byte(line), &rep); err == nil {
						rk.reports <- rep
					}
				}
			}
			close(rk.reports)
			rk.err = cmd.Wait()
			close(rk.exited)
		}()
		rep := rk.next(t, 30*time.Second)
		if rep.Peer == nil {
			t.Fatalf("rank %d: first report %+v, want its PeerInfo", r, rep)
		}
		peers[r], ranks[r] = *rep.Peer, rk
	}
	all, _ := json.Marshal(peers)
	for r, rk := range ranks {
		if _, err := fmt.Fprintf(rk.stdin, "%s\n", all); err != nil {
			t.Fatalf("rank %d: send peers: %v", r, err)
		}
	}
	return ranks
}

// next returns the rank's next report, failing the test when it exits or
// says nothing for timeout.
func (rk *netRank) next(t *testing.T, timeout time.Duration) netReport {
	t.Helper()
	select {
	case rep, ok := <-rk.reports:
		if !ok {
			<-rk.exited
			t.Fatalf("rank exited: %v", rk.err)
		}
		return rep
	case <-time.After(timeout):
		t.Fatalf("no report from a rank within %v", timeout)
	}
	return netReport{}
}

// wait waits for the rank process to exit.
func (rk *netRank) wait() error {
	rk.stdin.Close()
	<-rk.exited
	return rk.err
}

// TestNetnsRank is a rank process of the tests above; it skips unless
// netRankEnv is set.
func TestNetnsRank(t *testing.T) {
	js := os.Getenv(netRankEnv)
	if js == "" {
		t.Skip("a rank process of TestNetns*, started by them")
	}
	var spec netRankSpec
	if err := json.Unmarshal([]byte(js), &spec); err != nil {
		t.Fatal(err)
	}
	report := func(rep netReport) {
		rep.At = time.Now()
		line, _ := json.Marshal(rep)
		fmt.Printf("%s%s\n", netReportTag, line)
	}
	ep, err := Listen(Options{Host: spec.Host})
	if err != nil {
		t.Fatal(err)
	}
	info := ep.Info()
	report(netReport{Peer: &info})
	var peers []PeerInfo
	line, err := bufio.NewReader(os.Stdin).ReadBytes('\n')
	if err == nil {
		err = json.Unmarshal(line, &peers)
	}
	if err != nil {
		t.Fatalf("read peers: %v", err)
	}
	cfg := Config{Timeout: time.Minute, LinkTimeout: netLinkTimeout, SHM: spec.SHM}
	c, err := Connect(t.Context(), ep, spec.Rank, peers, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	switch spec.Job {
	case "cut":
		runCut(t.Context(), c, spec, report)
		return
	case "idle":
		runIdle(t.Context(), c, report)
		return
	}
	var in *inputs
	for i, mc := range netMatrix(spec.Size) {
		if in == nil || len(in.sumHalves) != mc.count {
			in = newInputs(spec.Size, mc.count)
			if spec.Rank == spec.LateRank && mc.count > 1<<20 {
				time.Sleep(spec.Late)
			}
		}
		buf := in.encode(mc.dt)[spec.Rank]
		if err := c.AllReduce(t.Context(), buf, mc.dt, mc.op); err != nil {
			report(errReport(err))
			return
		}
		sum := sha256.Sum256(buf)
		report(netReport{Case: i + 1, Sum: hex.EncodeToString(sum[:]), Transport: c.Transport()})
	}
}

// runCut starts an all-reduce of spec.Count float32s, reports once data
// has moved both ways, and reports how it ended.
func runCut(ctx context.Context, c *Comm, spec netRankSpec, report func(netReport)) {
	errc := make(chan error, 1)
	go func() { errc <- c.AllReduce(ctx, make([]byte, 4*spec.Count), reduce.Float32, reduce.Sum) }()
	for c.received.n.Load() < 2 {
		select {
		case err := <-errc:
			report(errReport(fmt.Errorf("ended before the cut: %w", err)))
			return
		case <-time.After(time.Millisecond):
		}
	}
	report(netReport{Started: true})
	err := <-errc
	if err == nil {
		report(netReport{PeerRank: -1})
		return
	}
	report(errReport(err))
}

// runIdle runs one small all-reduce, reports, and reports why the Comm
// failed once it does, with no collective running.
func runIdle(ctx context.Context, c *Comm, report func(netReport)) {
	if err := c.AllReduce(ctx, make([]byte, 4<<10), reduce.Float32, reduce.Sum); err != nil {
		report(errReport(fmt.Errorf("ended before the cut: %w", err)))
		return
	}
	report(netReport{Started: true})
	select {
	case <-c.Done():
		report(errReport(c.Err()))
	case <-time.After(30 * time.Second):
		report(netReport{PeerRank: -1})
	}
}

func errReport(err error) netReport {
	rep := netReport{Err: err.Error(), IsPeer: errors.Is(err, failure.ErrPeer), PeerRank: -1}
	var pe *failure.PeerError
	if errors.As(err, &pe) {
		rep.PeerRank, rep.PeerKind = pe.Rank, pe.Kind
	}
	return rep
}

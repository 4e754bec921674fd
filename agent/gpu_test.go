package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/placement"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// TestMain doubles as the workers (AGENT_TEST_WORKER) and as ddp-agent's
// binding trampoline, so the agent's real worker path runs.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == "__bind" {
		err := placement.Exec(os.Args[2:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(127)
	}
	if os.Getenv("AGENT_TEST_WORKER") == "sleep" {
		signal.Reset()
		fmt.Printf("started gpu=%s visible=%s\n", os.Getenv("DDP_AGENT_GPU"), os.Getenv("CUDA_VISIBLE_DEVICES"))
		time.Sleep(time.Minute)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// logBuf is a log sink tests can wait on.
type logBuf struct{ syncbuf.Buffer }

// wait returns the first line matching re, within d.
func (l *logBuf) wait(t *testing.T, re string, d time.Duration) string {
	t.Helper()
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(d)
	for {
		if m := rx.FindString(l.String()); m != "" {
			return m
		}
		if time.Now().After(deadline) {
			t.Fatalf("no line matching %q within %v; log:\n%s", re, d, l.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gpuJob is an agent on the DGX A100 mock with two sleeping workers on
// GPUs 0 and 1, its NVML events injectable.
type gpuJob struct {
	events *nvmltest.Events
	log    *logBuf
	out    *logBuf
	done   chan error
	stop   context.CancelCauseFunc
	uuids  []string
}

func startGPUJob(t *testing.T, maxRestarts int) *gpuJob {
	t.Helper()
	server := nvmltest.DGXA100(true)
	nvmltest.QuietPolls(server)
	j := &gpuJob{events: nvmltest.NewEvents(server), log: &logBuf{}, out: &logBuf{}, done: make(chan error, 1)}
	topo, err := nvml.Discover(t.Context(), nvmltest.Lib(server), nvml.WithSysFS(nvmltest.DGXSysFS()))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range topo.GPUs {
		j.uuids = append(j.uuids, g.UUID)
	}
	plan, err := placement.New(placement.Input{Topology: topo, NProc: 2, Mode: placement.ModeNone})
	if err != nil {
		t.Fatal(err)
	}
	// As `ddp-agent run --no-python --nproc-per-node 2 --max-restarts N --stop-timeout 2s <test binary>`.
	cfg := Config{Command: []string{os.Args[0]}, NProcPerNode: 2, MaxRestarts: maxRestarts, StopTimeout: 2 * time.Second,
		Rendezvous: Rendezvous{NNodesMin: 1, NNodesMax: 1}, Telemetry: Telemetry{Config: observe.Config{HangTimeout: time.Minute, TraceSample: 0.1}}}
	log := slog.New(slog.NewTextHandler(j.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.GPUs = &GPUs{Topology: topo, Plan: plan, Binding: placement.ModeNone, Bind: os.Args[0],
		Watch: func(devs []health.Device, opts ...health.Option) *health.Watcher {
			return health.NewWatcher(nvmltest.Lib(server), devs, append(opts, health.WithInterval(50*time.Millisecond))...)
		}}
	a := New(cfg, log, supervisor.NewConsole(j.out), supervisor.NewConsole(j.out), append(os.Environ(), "AGENT_TEST_WORKER=sleep"))
	ctx, cancel := context.WithCancelCause(context.Background())
	j.stop = cancel
	go func() { j.done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel(errors.New("test over"))
		select {
		case <-j.done:
		case <-time.After(10 * time.Second):
			t.Error("agent did not stop within 10s")
		}
	})
	j.out.wait(t, `\[rank1\]:started`, 10*time.Second)
	return j
}

func (j *gpuJob) inject(t *testing.T, gpu int, xid uint64) time.Time {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	at := time.Now()
	if err := j.events.Inject(ctx, gpu, nvmltest.EventXID, xid); err != nil {
		t.Fatalf("inject XID %d on GPU %d: %v", xid, gpu, err)
	}
	return at
}

// TestGPUPlacementEnv: every worker sees the ring in CUDA_VISIBLE_DEVICES
// and its own GPU's UUID.
func TestGPUPlacementEnv(t *testing.T) {
	j := startGPUJob(t, 0)
	for rank := range 2 {
		want := fmt.Sprintf("[rank%d]:started gpu=%s visible=0,1,2,3,4,5,6,7", rank, j.uuids[rank])
		j.out.wait(t, regexp.QuoteMeta(want), time.Second)
	}
}

// TestGPUFaultRestarts: an XID that calls for a restart (31, a GPU memory
// page fault) stops the workers within a second, names the rank on that
// GPU, and a new attempt starts.
func TestGPUFaultRestarts(t *testing.T) {
	j := startGPUJob(t, 1)
	at := j.inject(t, 1, 31)
	line := j.log.wait(t, `msg="GPU fault: stopping the job's workers".*`, 2*time.Second)
	d := time.Since(at)
	t.Logf("XID 31 to the restart decision: %v", d)
	if d > time.Second {
		t.Errorf("acted on the XID after %v, want within 1s", d)
	}
	for _, want := range []string{"gpu=1", "uuid=" + j.uuids[1], "ranks=[1]", "xid=31"} {
		if !strings.Contains(line, want) {
			t.Errorf("log line %q lacks %q", line, want)
		}
	}
	j.log.wait(t, `msg="workers started" attempt=1`, 10*time.Second)
	if strings.Contains(j.log.String(), "this node leaves the job") {
		t.Error("a restart-class XID drained the node")
	}
}

// TestGPUFaultNoRestartsLeft: the same fault with --max-restarts 0 fails
// the job, with the GPU in the reason.
func TestGPUFaultNoRestartsLeft(t *testing.T) {
	j := startGPUJob(t, 0)
	j.inject(t, 0, 13)
	select {
	case err := <-j.done:
		var jf *JobFailedError
		if !errors.As(err, &jf) || !strings.Contains(jf.Reason, "GPU 0 ("+j.uuids[0]+")") || !strings.Contains(jf.Reason, "ranks 0") {
			t.Fatalf("Run: got %v, want a JobFailedError naming GPU 0 and rank 0", err)
		}
		j.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("the job did not fail")
	}
}

// TestGPUFaultDrains: XID 79 (fallen off the bus) makes the node leave: Run
// returns a *fault.GPUError naming the GPU and rank, the workers stopped.
func TestGPUFaultDrains(t *testing.T) {
	j := startGPUJob(t, 3)
	at := j.inject(t, 0, 79)
	j.log.wait(t, `msg="GPU fault: this node leaves the job".*ranks=\[0\]`, 2*time.Second)
	d := time.Since(at)
	t.Logf("XID 79 to the drain decision: %v", d)
	if d > time.Second {
		t.Errorf("acted on the XID after %v, want within 1s", d)
	}
	select {
	case err := <-j.done:
		var gf *fault.GPUError
		if !errors.As(err, &gf) || !gf.Drains() || gf.Findings[0].GPU != 0 || gf.Findings[0].XID != 79 {
			t.Fatalf("Run: got %v, want a draining fault.GPUError for XID 79 on GPU 0", err)
		}
		if !strings.Contains(err.Error(), j.uuids[0]) || !strings.Contains(err.Error(), "leaves the job") {
			t.Errorf("error %q: want the UUID and what happens", err)
		}
		j.done <- err
	case <-time.After(5 * time.Second):
		t.Fatal("the agent did not stop")
	}
	if strings.Contains(j.log.String(), `attempt=1`) {
		t.Error("a drained node restarted its workers")
	}
}

// TestGPUEventStorm: 100 XIDs a second that call for nothing (92, a high
// single-bit ECC rate) for a second neither restart the workers nor slow
// the agent: every event is taken at once, and a restart-class XID right
// after is still acted on within a second.
func TestGPUEventStorm(t *testing.T) {
	j := startGPUJob(t, 1)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var slowest time.Duration
	for i := range 100 {
		<-tick.C
		at := j.inject(t, i%8, 92)
		slowest = max(slowest, time.Since(at))
	}
	t.Logf("slowest event delivery in the storm: %v", slowest)
	if strings.Contains(j.log.String(), "GPU fault") {
		t.Fatalf("an ignore-class storm acted on the workers:\n%s", j.log.String())
	}
	if !strings.Contains(j.log.String(), "Xid 92") {
		t.Errorf("the storm's XIDs were not logged:\n%s", j.log.String())
	}
	// GPU 5 runs none of this job's workers: a contained memory error
	// there (94) is another process's, and restarts nothing.
	j.inject(t, 5, 94)
	j.log.wait(t, `GPU fault on a GPU without workers of this job.*gpu=5`, 2*time.Second)
	at := j.inject(t, 1, 94)
	j.log.wait(t, `msg="GPU fault: stopping the job's workers".*gpu=1`, 2*time.Second)
	if d := time.Since(at); d > time.Second {
		t.Errorf("acted on the XID after the storm in %v, want within 1s", d)
	}
	j.log.wait(t, `msg="workers started" attempt=1`, 10*time.Second)
	if n := strings.Count(j.log.String(), "GPU fault: stopping"); n != 1 {
		t.Errorf("%d restarts, want 1 (for GPU 1 only)", n)
	}
}

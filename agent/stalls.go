package agent

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/stall"
)

// The agent's view of its workers' collectives: each event the shims send
// becomes a record for the stall analyzer; complete collectives go to the
// exporter (traces, metrics, the Perfetto file), stalls get a log
// paragraph, and a collective that stays unfinished past --hang-timeout
// ends the attempt with a report naming the ranks that never arrived and
// their Python stacks.
//
// Each agent analyzes its own node's ranks. Across nodes a collective is
// complete only when every node's ranks have reported, which needs the
// records of the other nodes; until they are forwarded, a multi-node job
// gets each node's view (stragglers among its own ranks, hangs in which
// all of them wait for ranks elsewhere).

// exporter is what the stall watch feeds: package export's Exporter.
type exporter interface {
	Collectives([]telemetry.Collective)
	Hang(telemetry.Hang, map[int]string)
	Restart(gen uint64, reason string)
	Generation(gen uint64)
}

// HangError ends an attempt whose collective hung.
type HangError struct {
	Hang   telemetry.Hang
	Report string // the paragraph that was logged, stacks included
}

func (e *HangError) Error() string {
	return fmt.Sprintf("collective hung in step %d bucket %d: %s never arrived", e.Hang.Step, e.Hang.Bucket, rankList(e.Hang.Missing))
}

// stackWait is how long a rank gets to write its stacks after SIGUSR2.
const stackWait = time.Second

type stallWatch struct {
	log         *slog.Logger
	hangTimeout time.Duration
	exp         exporter // set before the first attempt
	hangs       chan *HangError

	mu       sync.Mutex
	an       *stall.Analyzer // nil between attempts
	gen      uint64
	offset   int // global rank of local rank 0: the analyzer sees local ranks
	workers  []telemetry.Worker
	stackDir string
	hung     bool // this attempt's hang was reported
	stalls   []string
	lastHang string
	known    map[int]bool // persistent stragglers already logged, this attempt
	dirty    bool         // something to publish
}

// stallPublisher is the rendezvous when it has a store for status.
type stallPublisher interface {
	PublishStalls(context.Context, rdzv.NodeStalls) error
}

// publish puts what status shows into the store every 2 s while there is
// something new, until ctx ends; it never holds up the analysis.
func (s *stallWatch) publish(ctx context.Context, pub stallPublisher) {
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.noteStragglers()
		s.mu.Lock()
		if !s.dirty {
			s.mu.Unlock()
			continue
		}
		s.dirty = false
		ns := rdzv.NodeStalls{Stalls: slices.Clone(s.stalls), Hang: s.lastHang}
		an, offset := s.an, s.offset
		s.mu.Unlock()
		if an != nil {
			for _, st := range an.Stragglers() {
				w := s.worker(st.Rank + offset)
				ns.Stragglers = append(ns.Stragglers, rdzv.StragglerInfo{Rank: st.Rank + offset, Last: st.Last, Steps: st.Steps, Host: w.Host, GPU: w.GPU})
			}
		}
		if err := pub.PublishStalls(ctx, ns); err != nil {
			s.log.Debug("publish stalls for status", "err", err)
		}
	}
}

// noteStragglers logs each new persistent straggler of the attempt once.
func (s *stallWatch) noteStragglers() {
	s.mu.Lock()
	an, offset := s.an, s.offset
	s.mu.Unlock()
	if an == nil {
		return
	}
	for _, st := range an.Stragglers() {
		rank := st.Rank + offset
		s.mu.Lock()
		seen := s.known[rank]
		if s.known == nil {
			s.known = map[int]bool{}
		}
		s.known[rank] = true
		s.dirty = s.dirty || !seen
		s.mu.Unlock()
		if !seen {
			s.log.Warn(fmt.Sprintf("persistent straggler: rank %s arrived last in %d of the last %d steps", s.describe(rank), st.Last, st.Steps),
				"rank", rank, "gpu", s.worker(rank).GPU)
		}
	}
}

func newStallWatch(log *slog.Logger, hangTimeout time.Duration) *stallWatch {
	return &stallWatch{log: log, hangTimeout: hangTimeout, hangs: make(chan *HangError, 1)}
}

// start begins an attempt: workers by local rank, their stack directory.
func (s *stallWatch) start(gen uint64, offset int, workers []telemetry.Worker, stackDir string) {
	an, err := stall.New(stall.Config{WorldSize: len(workers)})
	if err != nil { // only a zero world size fails, and then there is nothing to watch
		s.log.Warn("stall analysis off", "err", err)
	}
	s.mu.Lock()
	s.an, s.gen, s.offset, s.workers, s.stackDir, s.hung, s.known = an, gen, offset, workers, stackDir, false, nil
	s.mu.Unlock()
	if s.exp != nil {
		s.exp.Generation(gen)
	}
}

// stop ends the attempt: late events are ignored.
func (s *stallWatch) stop() {
	s.mu.Lock()
	s.an = nil
	s.mu.Unlock()
}

// worker is the Worker of a global rank (the exporter's Config.Worker).
func (s *stallWatch) worker(rank int) telemetry.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if lr := rank - s.offset; lr >= 0 && lr < len(s.workers) {
		return s.workers[lr]
	}
	return telemetry.Worker{Rank: rank, LocalRank: -1, GPUIndex: -1}
}

// add is the control server's OnEvents: a batch from the worker of rank.
func (s *stallWatch) add(rank int, ev control.Events) {
	s.mu.Lock()
	an, gen, lr := s.an, s.gen, rank-s.offset
	s.mu.Unlock()
	if an == nil || lr < 0 {
		return
	}
	var done []telemetry.Collective
	for _, e := range ev.Events {
		r := telemetry.Record{Gen: gen, Step: e.Step, Bucket: e.Bucket, Rank: lr, Bytes: e.Bytes, DType: e.DType,
			Status: e.Status, Arrive: unixNano(e.TArrive), Start: unixNano(e.TStart), End: unixNano(e.TEnd)}
		done = append(done, an.Add(r)...)
	}
	if len(done) == 0 {
		return
	}
	for i := range done { // back to global ranks for reports and spans
		c := &done[i]
		for j := range c.Records {
			c.Records[j].Rank += s.offset
		}
		if c.Stall != nil {
			c.Stall.Straggler += s.offset
			s.reportStall(*c)
		}
	}
	if s.exp != nil {
		s.exp.Collectives(done)
	}
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// reportStall logs the paragraph a person can act on.
func (s *stallWatch) reportStall(c telemetry.Collective) {
	st := c.Stall
	unit := "GPU-seconds"
	if s.worker(st.Straggler).GPU == "" {
		unit = "seconds"
	}
	msg := fmt.Sprintf("step %d bucket %d: rank %s arrived %s after the others; %d ranks waited %.1f %s",
		c.Step, c.Bucket, s.describe(st.Straggler), seconds(st.Late), st.Waiters, st.Waited.Seconds(), unit)
	s.log.Warn("stall: "+msg, "generation", c.Gen, "step", c.Step, "bucket", c.Bucket, "straggler", st.Straggler,
		"late", st.Late.Round(time.Millisecond), "waited", st.Waited.Round(time.Millisecond),
		"duration", c.Duration().Round(time.Millisecond), "threshold", st.Threshold.Round(time.Millisecond))
	s.mu.Lock()
	s.stalls = append(s.stalls, msg)
	if len(s.stalls) > rdzv.MaxStallLines {
		s.stalls = s.stalls[len(s.stalls)-rdzv.MaxStallLines:]
	}
	s.dirty = true
	s.mu.Unlock()
}

// describe is "5 (node-b, GPU 1, pid 4411)".
func (s *stallWatch) describe(rank int) string {
	w := s.worker(rank)
	parts := []string{}
	if w.Host != "" {
		parts = append(parts, w.Host)
	}
	if w.GPU != "" {
		parts = append(parts, fmt.Sprintf("GPU %d", w.GPUIndex))
	}
	if w.PID != 0 {
		parts = append(parts, fmt.Sprintf("pid %d", w.PID))
	}
	if len(parts) == 0 {
		return fmt.Sprint(rank)
	}
	return fmt.Sprintf("%d (%s)", rank, strings.Join(parts, ", "))
}

func seconds(d time.Duration) string {
	if d < time.Second {
		return d.Round(time.Millisecond).String()
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// run checks for hangs once a second until ctx ends.
func (s *stallWatch) run(ctx context.Context) {
	if s.hangTimeout <= 0 {
		return
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.checkHang(ctx, now)
		}
	}
}

func (s *stallWatch) checkHang(ctx context.Context, now time.Time) {
	s.mu.Lock()
	an, hung, offset := s.an, s.hung, s.offset
	s.mu.Unlock()
	if an == nil || hung {
		return
	}
	h := an.Hang(now, s.hangTimeout)
	if h == nil {
		return
	}
	s.mu.Lock()
	if s.an != an || s.hung { // the attempt ended meanwhile
		s.mu.Unlock()
		return
	}
	s.hung = true
	s.mu.Unlock()
	for i := range h.Waiting {
		h.Waiting[i] += offset
	}
	for i := range h.Missing {
		h.Missing[i] += offset
	}
	stacks := s.stacks(ctx, h.Missing)
	report := s.hangReport(*h, now, stacks)
	s.log.Error("hang: " + report)
	s.mu.Lock()
	s.lastHang, s.dirty = "hang: "+report, true
	s.mu.Unlock()
	if s.exp != nil {
		s.exp.Hang(*h, stacks)
	}
	select {
	case s.hangs <- &HangError{Hang: *h, Report: report}:
	default: // one is already waiting for the round watcher
	}
}

func (s *stallWatch) hangReport(h telemetry.Hang, now time.Time, stacks map[int]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d bucket %d (generation %d) has not finished %s after the first rank arrived; ",
		h.Step, h.Bucket, h.Gen, seconds(now.Sub(h.Since)))
	fmt.Fprintf(&b, "waiting: %s; ", rankList(h.Waiting))
	if len(h.Missing) == 0 {
		b.WriteString("every rank of this node arrived: the missing ranks are on other nodes")
	} else {
		descs := make([]string, len(h.Missing))
		for i, r := range h.Missing {
			descs[i] = "rank " + s.describe(r)
		}
		fmt.Fprintf(&b, "never arrived: %s", strings.Join(descs, ", "))
	}
	b.WriteString(". Aborting the communicators and restarting the job.")
	for _, r := range h.Missing {
		if st, ok := stacks[r]; ok {
			fmt.Fprintf(&b, "\nPython stack of rank %d:\n%s", r, strings.TrimRight(st, "\n"))
		} else {
			fmt.Fprintf(&b, "\nno Python stack from rank %d (it did not register ddp_agent's hook, or did not answer within %v)", r, stackWait)
		}
	}
	return b.String()
}

// stacks asks the local ranks among ranks for their Python stacks: the
// ddp_agent package registered faulthandler on SIGUSR2 and created its
// stack file (the signal is sent only then: its default action kills).
func (s *stallWatch) stacks(ctx context.Context, ranks []int) map[int]string {
	s.mu.Lock()
	dir, offset, workers := s.stackDir, s.offset, s.workers
	s.mu.Unlock()
	out := map[int]string{}
	if dir == "" {
		return out
	}
	asked := map[int]string{}
	for _, r := range ranks {
		lr := r - offset
		if lr < 0 || lr >= len(workers) || workers[lr].PID == 0 {
			continue
		}
		path := filepath.Join(dir, fmt.Sprintf("rank%d.txt", r))
		if _, err := os.Stat(path); err != nil {
			continue
		}
		if err := syscall.Kill(workers[lr].PID, syscall.SIGUSR2); err != nil {
			s.log.Warn("ask for a Python stack", "rank", r, "pid", workers[lr].PID, "err", err)
			continue
		}
		asked[r] = path
	}
	if len(asked) == 0 {
		return out
	}
	// faulthandler writes from the signal handler at once; give the
	// process a moment to be scheduled.
	deadline := time.Now().Add(stackWait)
	for len(out) < len(asked) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		for r, path := range asked {
			if b, err := os.ReadFile(path); err == nil && len(b) > 0 {
				out[r] = string(b)
			}
		}
	}
	return out
}

// recentStalls are the last stall paragraphs, oldest first.
func (s *stallWatch) recentStalls() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.stalls)
}

func rankList(ranks []int) string {
	if len(ranks) == 0 {
		return "none"
	}
	parts := make([]string, len(ranks))
	for i, r := range ranks {
		parts[i] = fmt.Sprint(r)
	}
	if len(parts) == 1 {
		return "rank " + parts[0]
	}
	return "ranks " + strings.Join(parts, ", ")
}

// workers describes the attempt's workers by local rank.
func (a *Agent) workers(g *supervisor.Group, offset int) []telemetry.Worker {
	host, _ := os.Hostname()
	pids := g.PIDs()
	ws := make([]telemetry.Worker, a.cfg.NProcPerNode)
	for lr := range ws {
		ws[lr] = telemetry.Worker{Rank: offset + lr, LocalRank: lr, Host: host, PID: pids[offset+lr], GPUIndex: -1}
		if a.gpus != nil && a.gpus.Plan != nil && lr < len(a.gpus.Plan.Workers) {
			if pw := a.gpus.Plan.Workers[lr]; pw.UUID != "" {
				// The index in the workers' CUDA order: the ring position.
				ws[lr].GPU, ws[lr].GPUIndex = pw.UUID, lr
			}
		}
	}
	return ws
}

// openExporter starts the traces, metrics and Perfetto file of this run,
// as the flags and the OTEL_* variables say; close flushes them (bounded).
func (a *Agent) openExporter(ctx context.Context, runID, runDir string, keep bool, worker func(int) telemetry.Worker) (exporter, func(), error) {
	cfg := a.cfg
	host, _ := os.Hostname()
	traceDir := ""
	if keep {
		traceDir = runDir
	}
	topo := ""
	if a.gpus != nil && a.gpus.Topology != nil {
		topo = a.gpus.Topology.Summary()
	}
	ec := export.Config{
		JobID: runID, NodeRank: cfg.NodeRank, Host: host, Topology: topo,
		Endpoint: cfg.OTelEndpoint, SampleRatio: cfg.TraceSample, TraceDir: traceDir, MetricsAddr: cfg.MetricsAddr,
		Worker: worker, Logger: a.log,
	}
	exp, err := export.New(ctx, ec)
	if err != nil {
		return nil, func() {}, fmt.Errorf("telemetry: %w", err)
	}
	if u := exp.MetricsURL(); u != "" {
		a.log.Info("Prometheus metrics", "url", u)
	}
	return exp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := exp.Shutdown(sctx); err != nil {
			a.log.Warn("telemetry shutdown", "err", err)
		}
	}, nil
}

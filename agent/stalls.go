package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/relay"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/stall"
	"github.com/ddp-agent/ddp-agent/nvml"
)

// The agent's view of its workers' collectives: each event the shims send
// becomes a record for the stall analyzer; complete collectives go to the
// exporter (traces, metrics, the Perfetto file), stalls get a log
// paragraph, and a collective that stays unfinished past --hang-timeout
// ends the attempt with a report naming the ranks that never arrived and
// their Python stacks.
//
// Across nodes a collective is complete only when every node's ranks have
// reported: the agent of group rank 0 analyzes the whole job, the others
// forward their records to it with their clocks corrected (planAnalysis).

// exporter is what the stall watch feeds: package export's Exporter.
type exporter interface {
	Collectives([]telemetry.Collective)
	Hang(telemetry.Hang, map[int]string)
	Restart(gen uint64, reason string)
	Generation(gen uint64)
}

// forwarder carries a follower's records to the leader (relay.Client).
type forwarder interface {
	Send([]telemetry.Record)
	SendWorkers([]telemetry.Worker)
	SendStacks(map[int]string)
	Hangs() <-chan telemetry.Hang
}

// stackAsker makes the followers collect their ranks' stacks (relay.Server).
type stackAsker interface {
	RequestStacks(telemetry.Hang)
}

// HangError ends an attempt whose collective hung.
type HangError struct {
	Hang   telemetry.Hang
	Report string // the paragraph that was logged, stacks included
}

func (e *HangError) Error() string {
	return fmt.Sprintf("collective hung in step %d bucket %d: %s never arrived", e.Hang.Step, e.Hang.Bucket, rankList(e.Hang.Missing))
}

// stackWait is how long a rank gets to write its stacks after SIGUSR2;
// remote ranks get another second for the trip.
const stackWait = time.Second

// attempt is what the stall watch knows of the current attempt.
type attempt struct {
	gen      uint64
	an       *stall.Analyzer // nil on a follower
	base     int             // the global rank of the analyzer's rank 0
	local    []telemetry.Worker
	offset   int // global rank of local rank 0
	fwd      forwarder
	asker    stackAsker
	stackDir string
}

type stallWatch struct {
	log         *slog.Logger
	hangTimeout time.Duration
	hangAuto    bool     // the timeout grows to 10 × the median step time
	exp         exporter // set before the first attempt
	hangs       chan *HangError
	remote      chan map[int]string        // stacks from followers
	rankOf      func(pid int) (int, error) // the rank of a worker or its descendant
	readGPU     func(uuid string) (nvml.GPUState, error)

	mu       sync.Mutex
	at       *attempt // nil between attempts
	workers  map[int]telemetry.Worker
	hung     bool // this attempt's hang was reported
	stalls   []string
	lastHang string
	known    map[int]bool // persistent stragglers already logged, this attempt
	dirty    bool         // something to publish
	steps    stepClock
	// progress is when a collective last completed, on this agent's
	// monotonic clock: the workers' arrival times are wall-clock times,
	// and a clock step must not look like a hang.
	progress time.Time
}

// stepClock estimates the step time from when bucket 0's all-reduce
// begins (its first arrival) in consecutive steps.
type stepClock struct {
	last      uint64
	lastStart time.Time
	intervals []time.Duration // the most recent, at most stepWindow
}

const stepWindow = 20

func (c *stepClock) observe(step uint64, start time.Time) {
	if !c.lastStart.IsZero() && step == c.last+1 && start.After(c.lastStart) {
		c.intervals = append(c.intervals, start.Sub(c.lastStart))
		if len(c.intervals) > stepWindow {
			c.intervals = c.intervals[1:]
		}
	}
	if c.lastStart.IsZero() || step > c.last {
		c.last, c.lastStart = step, start
	}
}

// median is the median step time, 0 before five steps.
func (c *stepClock) median() time.Duration {
	if len(c.intervals) < 5 {
		return 0
	}
	s := slices.Clone(c.intervals)
	slices.Sort(s)
	return s[len(s)/2]
}

// timeout is the hang timeout now: the flag's, or with auto the longer of
// it and 10 × the median step time (a job whose steps take minutes must
// not look hung at 60 s).
func (s *stallWatch) timeout() time.Duration {
	if !s.hangAuto {
		return s.hangTimeout
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.hangTimeout, 10*s.steps.median())
}

func newStallWatch(log *slog.Logger, hangTimeout time.Duration) *stallWatch {
	return &stallWatch{log: log, hangTimeout: hangTimeout, hangs: make(chan *HangError, 1), remote: make(chan map[int]string, 16)}
}

// start begins an attempt. Its analysis covers ranks [base, base+size):
// all of them on the leader (or a single node), this node's when the
// records cannot be gathered. A follower (fwd not nil) forwards instead.
func (s *stallWatch) start(gen uint64, base, size int, local []telemetry.Worker, offset int, stackDir string, fwd forwarder, asker stackAsker) {
	at := &attempt{gen: gen, base: base, local: local, offset: offset, fwd: fwd, asker: asker, stackDir: stackDir}
	if fwd == nil {
		an, err := stall.New(stall.Config{WorldSize: size})
		if err != nil { // only an empty world fails, and then there is nothing to watch
			s.log.Warn("stall analysis off", "err", err)
		}
		at.an = an
	}
	s.mu.Lock()
	s.at, s.hung, s.known, s.steps, s.progress = at, false, nil, stepClock{}, time.Now()
	select { // a hang of the last attempt that nobody took
	case <-s.hangs:
	default:
	}
	s.workers = map[int]telemetry.Worker{}
	for _, w := range local {
		s.workers[w.Rank] = w
	}
	s.mu.Unlock()
	if fwd != nil {
		fwd.SendWorkers(local)
	}
	if s.exp != nil {
		s.exp.Generation(gen)
	}
}

// stop ends the attempt: late events are ignored.
func (s *stallWatch) stop() {
	s.mu.Lock()
	s.at = nil
	s.mu.Unlock()
	for { // stacks that came too late for the last hang
		select {
		case <-s.remote:
		default:
			return
		}
	}
}

func (s *stallWatch) current() *attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

// worker is the Worker of a global rank (the exporter's Config.Worker).
func (s *stallWatch) worker(rank int) telemetry.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.workers[rank]; ok {
		return w
	}
	return telemetry.Worker{Rank: rank, LocalRank: -1, GPUIndex: -1}
}

// add is the control server's OnEvents: a batch from the worker of rank.
func (s *stallWatch) add(rank int, ev control.Events) {
	at := s.current()
	if at == nil {
		return
	}
	recs := make([]telemetry.Record, len(ev.Events))
	for i, e := range ev.Events {
		recs[i] = telemetry.Record{Gen: at.gen, Step: e.Step, Bucket: e.Bucket, Rank: rank, Bytes: e.Bytes, DType: e.DType,
			Status: e.Status, Arrive: unixNano(e.TArrive), Start: unixNano(e.TStart), End: unixNano(e.TEnd)}
	}
	if at.fwd != nil {
		at.fwd.Send(recs)
		return
	}
	s.analyze(at, recs)
}

// Records, Workers and Stacks are the leader's relay.Handler: what the
// followers send.
func (s *stallWatch) Records(node string, recs []telemetry.Record) {
	if at := s.current(); at != nil && at.an != nil {
		s.analyze(at, recs)
	}
}

func (s *stallWatch) Workers(node string, ws []telemetry.Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range ws {
		if s.workers != nil {
			s.workers[w.Rank] = w
		}
	}
}

func (s *stallWatch) Stacks(node string, stacks map[int]string) {
	select {
	case s.remote <- stacks:
	default:
		s.log.Warn("Python stacks from another node dropped: too many at once", "node", node)
	}
}

// analyze feeds global-rank records of at to its analyzer.
func (s *stallWatch) analyze(at *attempt, recs []telemetry.Record) {
	if at.an == nil {
		return
	}
	var done []telemetry.Collective
	for _, r := range recs {
		if r.Gen != at.gen {
			continue
		}
		r.Rank -= at.base
		done = append(done, at.an.Add(r)...)
	}
	if len(done) == 0 {
		return
	}
	s.mu.Lock()
	s.progress = time.Now()
	s.mu.Unlock()
	for i := range done { // back to global ranks for reports and spans
		c := &done[i]
		for j := range c.Records {
			c.Records[j].Rank += at.base
		}
		if c.Bucket == 0 && len(c.Records) > 0 {
			first := c.Records[0].Arrive
			for _, r := range c.Records {
				if r.Arrive.Before(first) {
					first = r.Arrive
				}
			}
			s.mu.Lock()
			s.steps.observe(c.Step, first)
			s.mu.Unlock()
		}
		if c.Stall != nil {
			c.Stall.Straggler += at.base
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
		stragglers := s.noteStragglers()
		s.mu.Lock()
		if !s.dirty {
			s.mu.Unlock()
			continue
		}
		s.dirty = false
		ns := rdzv.NodeStalls{Stalls: slices.Clone(s.stalls), Hang: s.lastHang}
		s.mu.Unlock()
		for _, st := range stragglers {
			w := s.worker(st.Rank)
			ns.Stragglers = append(ns.Stragglers, rdzv.StragglerInfo{Rank: st.Rank, Last: st.Last, Steps: st.Steps, Host: w.Host, GPU: w.GPU})
		}
		if err := pub.PublishStalls(ctx, ns); err != nil {
			s.log.Debug("publish stalls for status", "err", err)
			s.mu.Lock()
			s.dirty = true // again at the next tick
			s.mu.Unlock()
		}
	}
}

// noteStragglers logs each new persistent straggler of the attempt once
// and returns them all, by global rank.
func (s *stallWatch) noteStragglers() []telemetry.Straggler {
	at := s.current()
	if at == nil || at.an == nil {
		return nil
	}
	all := at.an.Stragglers()
	for i := range all {
		all[i].Rank += at.base
		rank := all[i].Rank
		s.mu.Lock()
		seen := s.known[rank]
		if s.known == nil {
			s.known = map[int]bool{}
		}
		s.known[rank] = true
		s.dirty = s.dirty || !seen
		s.mu.Unlock()
		if !seen {
			w := s.worker(rank)
			msg := fmt.Sprintf("persistent straggler: rank %s arrived last in %d of the last %d steps", s.describe(rank), all[i].Last, all[i].Steps)
			if st := s.gpuState(w); st != "" {
				msg += "; its GPU " + w.GPU + ": " + st
			}
			s.log.Warn(msg, "rank", rank, "gpu", w.GPU)
		}
	}
	return all
}

// gpuState is what NVML says of w's GPU now, when it is on this node.
func (s *stallWatch) gpuState(w telemetry.Worker) string {
	if w.GPU == "" || s.readGPU == nil {
		return ""
	}
	at := s.current()
	if at == nil || w.Rank < at.offset || w.Rank >= at.offset+len(at.local) {
		return w.GPUState // on another node: as its agent last read it
	}
	st, err := s.readGPU(w.GPU)
	if err != nil {
		return "state unknown (" + err.Error() + ")"
	}
	return st.String()
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

// seconds is "502ms" below a second, "2.31 s" from there (rounding
// first, so 999.6ms is "1.00 s", not "1s").
func seconds(d time.Duration) string {
	if d = d.Round(time.Millisecond); d < time.Second {
		return d.String()
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

// run checks for hangs and new persistent stragglers once a second
// until ctx ends.
func (s *stallWatch) run(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if s.hangTimeout > 0 {
				s.checkHang(ctx, now)
			}
			s.noteStragglers()
		}
	}
}

// gpuStateEvery is how often a follower sends its workers' GPU states.
const gpuStateEvery = 10 * time.Second

// sendGPUStates is a follower's side of persistent stragglers: the leader
// cannot read this node's NVML, so the workers go to it again every
// gpuStateEvery with their GPUs' states, until ctx ends.
func (s *stallWatch) sendGPUStates(ctx context.Context, fwd forwarder, local []telemetry.Worker) {
	if s.readGPU == nil {
		return
	}
	t := time.NewTicker(gpuStateEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ws := slices.Clone(local)
		for i := range ws {
			if ws[i].GPU == "" {
				continue
			}
			if st, err := s.readGPU(ws[i].GPU); err == nil {
				ws[i].GPUState = st.String()
			}
		}
		fwd.SendWorkers(ws)
	}
}

// answerHangs is a follower's side of a hang: the leader asks for the
// stacks of its missing ranks, this node sends those of its own.
func (s *stallWatch) answerHangs(ctx context.Context, fwd forwarder) {
	for {
		select {
		case <-ctx.Done():
			return
		case h, ok := <-fwd.Hangs():
			if !ok {
				return
			}
			at := s.current()
			if at == nil || at.gen != h.Gen {
				continue
			}
			fwd.SendStacks(s.stacks(ctx, at, h.Missing))
		}
	}
}

func (s *stallWatch) checkHang(ctx context.Context, now time.Time) {
	at := s.current()
	if at == nil || at.an == nil {
		return
	}
	timeout := s.timeout()
	s.mu.Lock()
	quiet := time.Since(s.progress)
	s.mu.Unlock()
	if quiet < timeout { // in a hang nothing completes: DDP's ranks move in step
		return
	}
	h := at.an.Hang(now, timeout)
	if h == nil {
		return
	}
	s.mu.Lock()
	if s.at != at || s.hung { // the attempt ended meanwhile, or its hang is out
		s.mu.Unlock()
		return
	}
	s.hung = true
	s.mu.Unlock()
	for i := range h.Waiting {
		h.Waiting[i] += at.base
	}
	for i := range h.Missing {
		h.Missing[i] += at.base
	}
	remote := 0
	for _, r := range h.Missing {
		if r < at.offset || r >= at.offset+len(at.local) {
			remote++
		}
	}
	if remote > 0 && at.asker != nil {
		at.asker.RequestStacks(*h)
	}
	stacks := s.stacks(ctx, at, h.Missing)
	if remote > 0 && at.asker != nil {
		deadline := time.After(stackWait + time.Second)
	wait:
		for got := 0; got < remote; {
			select {
			case st := <-s.remote:
				for r, text := range st {
					if _, dup := stacks[r]; !dup && slices.Contains(h.Missing, r) {
						stacks[r] = text
						got++
					}
				}
			case <-deadline:
				break wait
			case <-ctx.Done():
				break wait
			}
		}
	}
	report := s.hangReport(*h, now, stacks)
	s.log.Error("hang: " + report)
	s.mu.Lock()
	s.lastHang, s.dirty = "hang: "+report, true
	s.mu.Unlock()
	if s.exp != nil {
		s.exp.Hang(*h, stacks)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at != at { // the attempt ended while the stacks were collected: nothing to end
		return
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
		b.WriteString("every rank analyzed here arrived: the missing ranks are on other nodes")
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
			fmt.Fprintf(&b, "\nno Python stack from rank %d (it did not register ddp_agent's hook, or did not answer in time)", r)
		}
	}
	return b.String()
}

// stacks asks the ranks among ranks that run on this node for their
// Python stacks: the ddp_agent package registered faulthandler on SIGUSR2
// and created its stack file (the signal is sent only then: its default
// action kills).
func (s *stallWatch) stacks(ctx context.Context, at *attempt, ranks []int) map[int]string {
	out := map[int]string{}
	if at.stackDir == "" {
		return out
	}
	asked := map[int]string{}
	for _, r := range ranks {
		if lr := r - at.offset; lr < 0 || lr >= len(at.local) {
			continue
		}
		// The package names its file after the process that registered
		// the handler: the worker, or a process a wrapper script started.
		// Only that one may get the signal (its default action kills), and
		// only if it is this rank's worker or one of its descendants.
		paths, _ := filepath.Glob(filepath.Join(at.stackDir, fmt.Sprintf("rank%d-pid*.txt", r)))
		for _, path := range paths {
			var pid int
			if _, err := fmt.Sscanf(filepath.Base(path), fmt.Sprintf("rank%d-pid%%d.txt", r), &pid); err != nil || pid <= 0 {
				continue
			}
			if s.rankOf == nil {
				continue
			}
			if got, err := s.rankOf(pid); err != nil || got != r {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
				s.log.Warn("ask for a Python stack", "rank", r, "pid", pid, "err", err)
				continue
			}
			asked[r] = path
		}
	}
	if len(asked) == 0 {
		return out
	}
	// faulthandler writes from the signal handler at once; give the
	// process a moment to be scheduled.
	// process a moment to be scheduled, and take a dump once it stopped
	// growing.
	deadline := time.Now().Add(stackWait)
	settled := map[int]bool{}
	for len(settled) < len(asked) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		for r, path := range asked {
			b, err := os.ReadFile(path)
			if err != nil || len(b) == 0 {
				continue
			}
			settled[r] = out[r] == string(b)
			out[r] = string(b)
			if !settled[r] {
				delete(settled, r)
			}
		}
	}
	return out
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
	// An http(s):// endpoint means OTLP/HTTP, as the flag's help says,
	// unless the standard variables ask for gRPC.
	if strings.HasPrefix(cfg.OTelEndpoint, "http://") || strings.HasPrefix(cfg.OTelEndpoint, "https://") {
		if os.Getenv("OTEL_EXPORTER_OTLP_PROTOCOL") == "" && os.Getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") == "" {
			ec.Protocol = export.ProtocolHTTP
		}
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

// relayWait bounds a follower's wait for the leader's relay address; past
// it, the node analyzes its own ranks.
const relayWait = 10 * time.Second

// analysis decides, at the start of an attempt, who analyzes what: on a
// single node, or without a job-wide store, this agent its own ranks; with
// several nodes, the agent of group rank 0 (the leader) all of them, the
// others forwarding their records to it through package relay. It returns
// what stallWatch.start needs and a func that ends the attempt's part.
type analysis struct {
	base, size int
	fwd        forwarder
	asker      stackAsker
	done       func()
}

// leaderRelay is the leader's relay server, started on first need and
// kept for the agent's life (the leader may change between generations).
type leaderRelay struct {
	mu  sync.Mutex
	srv *relay.Server
}

func (l *leaderRelay) close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.srv != nil {
		l.srv.Close()
	}
}

func (a *Agent) planAnalysis(ctx context.Context, j *joined, r *rdzv.Round, g *supervisor.Group, runID string, stalls *stallWatch, lr *leaderRelay) analysis {
	local := analysis{base: r.RankOffset, size: a.cfg.NProcPerNode, done: func() {}}
	if r.NNodes <= 1 || j.kv == nil {
		return local
	}
	token := relay.JobToken(runID, a.cfg.RdzvToken)
	key := runID + "/" + strconv.FormatUint(r.Generation, 10) + "/ddp-agent/telemetry-leader"
	if r.GroupRank == 0 {
		lr.mu.Lock()
		srv := lr.srv
		if srv == nil {
			var err error
			if srv, err = relay.Listen(net.JoinHostPort("", "0"), token, stalls, a.log); err != nil {
				lr.mu.Unlock()
				a.log.Warn("stall analysis of this node's ranks only: cannot listen for the other nodes' records", "err", err)
				return local
			}
			lr.srv = srv
		}
		lr.mu.Unlock()
		_, port, _ := net.SplitHostPort(srv.Addr())
		addr := net.JoinHostPort(r.MasterAddr, port)
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := j.kv.Set(sctx, key, []byte(addr)); err != nil {
			a.log.Warn("stall analysis of this node's ranks only: cannot publish the relay address", "err", err)
			return local
		}
		return analysis{base: 0, size: r.WorldSize, asker: srv, done: func() {}}
	}
	// Bounded, and cut short when the round ends (the leader failed to
	// start its workers, say): the caller has yet to watch the round.
	gctx, cancel := context.WithTimeout(ctx, relayWait)
	defer cancel()
	go func() {
		select {
		case <-r.Done():
			cancel()
		case <-gctx.Done():
		}
	}()
	addr, err := j.kv.Get(gctx, key)
	if err != nil {
		a.log.Warn("stall analysis of this node's ranks only: no relay address from the leader", "err", err)
		return local
	}
	host, _ := os.Hostname()
	cl, err := relay.Dial(gctx, relay.ClientConfig{Addr: string(addr), Node: relayNode(host, r), Token: token, Log: a.log})
	if err != nil {
		a.log.Warn("stall analysis of this node's ranks only: cannot reach the leader's relay", "addr", string(addr), "err", err)
		return local
	}
	hctx, stop := context.WithCancel(ctx)
	go stalls.answerHangs(hctx, cl)
	go stalls.sendGPUStates(hctx, cl, a.workers(g, r.RankOffset))
	return analysis{fwd: cl, done: func() { stop(); cl.Close() }}
}

// relayNode names this node to the leader.
func relayNode(host string, r *rdzv.Round) string {
	if host == "" {
		host = "node"
	}
	return fmt.Sprintf("%s-g%d", host, r.GroupRank)
}

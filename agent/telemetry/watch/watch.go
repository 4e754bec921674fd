// Package watch is the agent's view of its workers' collectives while an
// attempt runs: each event the shims send becomes a record for the stall
// analyzer (package stall); complete collectives go to the exporter
// (traces, metrics, the Perfetto file), stalls get a log paragraph,
// persistent stragglers a line with their GPU's state, and a collective
// that stays unfinished past the hang timeout ends the attempt (Config.OnHang)
// with a report naming the ranks that never arrived and their Python stacks.
//
// Across nodes a collective is complete only when every node's ranks have
// reported: the agent of group rank 0 analyzes the whole job, the others
// forward their records to it through package relay with their clocks
// corrected (Begin plans who does what).
//
// Three parts: the Watch (watch.go) lives for the agent's life, logs,
// exports, ends an attempt on its hang and publishes this node's
// telemetry.Report; each attempt's analysis is an attempt (attempt.go:
// records into collectives, the hang verdict, the persistent stragglers
// and their evidence), made afresh by Begin; the planner (plan.go) decides
// who analyzes what across nodes and runs the relay. The stores it uses
// are the small interfaces it declares (KV, Publisher): it imports
// neither the rendezvous nor the control socket.
package watch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/wire"
)

// Exporter is what the watch feeds: package export's Exporter.
type Exporter interface {
	Collectives([]telemetry.Collective)
	Hang(telemetry.Hang, map[int]string)
	Fault(gen uint64, reason string, restarting bool)
	Generation(gen uint64)
	Stragglers(gen uint64, named []telemetry.Straggler)
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

// Config is what a Watch needs for the agent's life.
type Config struct {
	Log         *slog.Logger
	HangTimeout time.Duration // 0: no hang detection
	HangAuto    bool          // the timeout grows to 10 × the median step time
	// StragglerCost is stall.Config.Cost: the share of step time a
	// persistent straggler must cost to be named; 0: the default.
	StragglerCost float64
	// RankOf is the rank of a worker or of one of its descendants; only
	// such a process is sent SIGUSR2 for its stack.
	RankOf func(pid int) (int, error)
	// ReadGPU reads the state of a GPU of this node now (temperature,
	// clocks, throttling) for the line of a persistent straggler and its
	// cause; nil without NVML.
	ReadGPU func(uuid string) (GPUReading, error)
	// ReadHost is what slows a rank of this node down on its host, in a
	// clause ("its threads waited for a CPU 23% of the time"), or "":
	// the evidence of cause "host" (hostmon.Monitor.Slowdown); nil: none.
	ReadHost func(rank int) string
	// OnStragglers, if set, gets the persistent stragglers named at each
	// look (Run's, every lookEvery, and Publish's, every 2 s; their causes
	// set; empty once none is), from those two goroutines; it must not
	// block. The straggler action
	// policy hangs here.
	OnStragglers func([]telemetry.Straggler)
	// OnHang ends the attempt whose collective hung; it is called at most
	// once per attempt, from the watch's goroutine, and must not block.
	OnHang func(*HangError)
	// Console, when set, gets a hang's Python stacks as they are, after its
	// one-line log record (which then leaves them out): the agent's
	// stderr, when that is a terminal.
	Console io.Writer
	// ReportDir, when set, gets each hang's report with the stacks, in a
	// file the log record names: a directory kept after the run.
	ReportDir string
	// OnRemoteHang, if set, is told on a follower of a hang the leader
	// found, once this node's stacks for it are sent; it must not block.
	// ddp-agent run leaves it nil (the leader's restart reaches every node
	// through the rendezvous); a sidecar aborts its ranks' communicators.
	OnRemoteHang func(telemetry.Hang)
}

// GPUReading is NVML's view of a GPU now.
type GPUReading struct {
	State    string // nvml.GPUState.String
	Slowdown string // nvml.GPUState.Slowdown; "" when nothing slows it
}

// Watch watches the collectives of one attempt at a time, for the
// agent's life. Each attempt's analysis is an attempt (attempt.go) made
// afresh by Begin, as the cross-node plan (plan.go) says; the Watch logs
// and exports what it finds, ends the attempt on a hang, and keeps this
// node's report for `ddp-agent status` (Publish). Its methods are safe
// for concurrent use.
type Watch struct {
	log    *slog.Logger
	cfg    Config
	exp    Exporter            // set before the first attempt
	plans  *planner            // who analyzes what across nodes
	remote chan map[int]string // stacks from followers

	mu       sync.Mutex
	at       *attempt // nil between attempts
	last     *attempt // the latest attempt, kept past its End for Worker
	stalls   []string // this node's report: the last stall lines,
	lastHang string   // the last hang report,
	reformed string   // the last in-process re-formation,
	dirty    bool     // and whether it changed since it was published
}

// New returns a watch with no attempt.
func New(cfg Config) *Watch {
	s := &Watch{log: cfg.Log, cfg: cfg, remote: make(chan map[int]string, 16)}
	s.plans = &planner{log: cfg.Log, handler: s, stacks: s.remoteHangStacks, onRemote: cfg.OnRemoteHang}
	if cfg.ReadGPU != nil || cfg.ReadHost != nil {
		s.plans.states = s.withEvidence
	}
	return s
}

// SetExporter sets where complete collectives, hangs and restarts go;
// call it before the first attempt.
func (s *Watch) SetExporter(exp Exporter) { s.exp = exp }

// Close stops the leader's relay server, if this agent ever led.
func (s *Watch) Close() { s.plans.relay.close() }

// Begin starts watching an attempt. It decides who analyzes what: on a
// single node, or without a job-wide store, this agent its own ranks; with
// several nodes, the agent of group rank 0 (the leader) all of them, the
// others forwarding their records to it through package relay. It blocks
// at most relayWait (a follower waiting for the leader's address). End
// ends the attempt.
func (s *Watch) Begin(ctx context.Context, a Attempt) {
	s.start(a.Gen, s.plans.plan(ctx, a), a.Workers, a.RankOffset, a.StackDir)
}

// start begins attempt gen as p plans it.
func (s *Watch) start(gen uint64, p plan, local []telemetry.Worker, offset int, stackDir string) {
	at := newAttempt(gen, p, local, offset, stackDir, s.cfg.StragglerCost, s.log)
	at.readLocal = s.localEvidence
	s.mu.Lock()
	s.at, s.last = at, at
	s.mu.Unlock()
	if p.fwd != nil {
		p.fwd.SendWorkers(local)
	}
	if s.exp != nil {
		s.exp.Generation(gen)
	}
}

// End ends the attempt: late events are ignored, and a follower stops
// forwarding.
func (s *Watch) End() {
	s.mu.Lock()
	at := s.at
	s.at = nil
	s.mu.Unlock()
	if at != nil {
		at.plan.done()
	}
	for { // stacks that came too late for the last hang
		select {
		case <-s.remote:
		default:
			return
		}
	}
}

func (s *Watch) current() *attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.at
}

// latest is the attempt running, or the last one to run; nil before the
// first.
func (s *Watch) latest() *attempt {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Worker is the Worker of a global rank (the exporter's Config.Worker).
func (s *Watch) Worker(rank int) telemetry.Worker {
	if at := s.latest(); at != nil {
		return at.worker(rank)
	}
	return unknownWorker(rank)
}

// Add is the control server's OnEvents: a batch from the worker of rank.
func (s *Watch) Add(rank int, ev wire.Events) {
	at := s.current()
	if at == nil {
		return
	}
	recs := make([]telemetry.Record, len(ev.Events))
	for i, e := range ev.Events {
		recs[i] = telemetry.Record{Gen: at.gen, Step: e.Step, Bucket: e.Bucket, Rank: rank, Bytes: e.Bytes, DType: e.DType,
			Status: e.Status, Arrive: unixNano(e.TArrive), Start: unixNano(e.TStart), End: unixNano(e.TEnd)}
	}
	if at.plan.fwd != nil {
		at.plan.fwd.Send(recs)
		return
	}
	s.analyze(at, recs)
}

// Records, Workers and Stacks are the leader's relay.Handler: what the
// followers send.
func (s *Watch) Records(node string, recs []telemetry.Record) {
	if at := s.latest(); at != nil {
		at.heardFrom(node, time.Now())
	}
	if at := s.current(); at != nil && at.an != nil {
		s.analyze(at, recs)
	}
}

// Workers records the workers of another node, for reports and spans.
func (s *Watch) Workers(node string, ws []telemetry.Worker) {
	if at := s.latest(); at != nil {
		at.heardFrom(node, time.Now(), ws...)
	}
}

// Stacks takes the Python stacks another node sent for a hang.
func (s *Watch) Stacks(node string, stacks map[int]string) {
	select {
	case s.remote <- stacks:
	default:
		s.log.Warn("Python stacks from another node dropped: too many at once", "node", node)
	}
}

// remoteHangStacks is a follower's answer to the leader's hang h: this
// node's stacks among its missing ranks (the planner's stacks).
func (s *Watch) remoteHangStacks(ctx context.Context, h telemetry.Hang) (map[int]string, bool) {
	at := s.current()
	if at == nil || at.gen != h.Gen {
		return nil, false
	}
	return s.stacks(ctx, at, h.Missing), true
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// seconds is "502ms" below a second, "2.31 s" from there (rounding
// first, so 999.6ms is "1.00 s", not "1s").
func seconds(d time.Duration) string {
	if d = d.Round(time.Millisecond); d < time.Second {
		return d.String()
	}
	return fmt.Sprintf("%.2f s", d.Seconds())
}

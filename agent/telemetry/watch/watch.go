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
package watch

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/stall"
	"github.com/ddp-agent/ddp-agent/wire"
)

// Exporter is what the watch feeds: package export's Exporter.
type Exporter interface {
	Collectives([]telemetry.Collective)
	Hang(telemetry.Hang, map[int]string)
	Restart(gen uint64, reason string)
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

// Watch watches the collectives of one attempt at a time. Its methods are
// safe for concurrent use.
type Watch struct {
	log         *slog.Logger
	hangTimeout time.Duration
	hangAuto    bool
	cost        float64
	rankOf      func(pid int) (int, error)
	readGPU     func(uuid string) (GPUReading, error)
	readHost    func(rank int) string
	onStraggler func([]telemetry.Straggler)
	onHang      func(*HangError)
	onRemote    func(telemetry.Hang)
	exp         Exporter            // set before the first attempt
	remote      chan map[int]string // stacks from followers
	relay       leaderRelay         // the leader's relay server, once needed

	mu       sync.Mutex
	at       *attempt // nil between attempts
	workers  map[int]telemetry.Worker
	hung     bool // this attempt's hang was reported
	stalls   []string
	lastHang string
	known    map[int]telemetry.Cause // the persistent stragglers named at the last look, this attempt, and their causes
	dirty    bool                    // something to publish
	evid     map[int]evidence        // every rank's evidence for a straggler's cause, as read at evidAt
	heard    heard                   // the leader's: the other nodes' ranks, and when each last sent
	unjudged string                  // the ranks last left unjudged, logged once
	evidAt   time.Time
	steps    stepClock
	// progress is when a collective last completed, on this agent's
	// monotonic clock: the workers' arrival times are wall-clock times,
	// and a clock step must not look like a hang.
	progress time.Time
}

// attempt is what the watch knows of the current attempt.
type attempt struct {
	gen      uint64
	an       *stall.Analyzer // nil on a follower
	base     int             // the global rank of the analyzer's rank 0
	local    []telemetry.Worker
	offset   int // global rank of local rank 0
	fwd      forwarder
	asker    stackAsker
	stackDir string
	done     func() // ends the attempt's part of the relay plan
}

// New returns a watch with no attempt.
func New(cfg Config) *Watch {
	return &Watch{log: cfg.Log, hangTimeout: cfg.HangTimeout, hangAuto: cfg.HangAuto, cost: cfg.StragglerCost, rankOf: cfg.RankOf,
		readGPU: cfg.ReadGPU, readHost: cfg.ReadHost, onStraggler: cfg.OnStragglers, onHang: cfg.OnHang, onRemote: cfg.OnRemoteHang, remote: make(chan map[int]string, 16)}
}

// SetExporter sets where complete collectives, hangs and restarts go;
// call it before the first attempt.
func (s *Watch) SetExporter(exp Exporter) { s.exp = exp }

// Close stops the leader's relay server, if this agent ever led.
func (s *Watch) Close() { s.relay.close() }

// start begins an attempt as p plans it. Its analysis covers ranks
// [p.base, p.base+p.size): all of them on the leader (or a single node),
// this node's when the records cannot be gathered. A follower (p.fwd not
// nil) forwards instead.
func (s *Watch) start(gen uint64, p analysis, local []telemetry.Worker, offset int, stackDir string) {
	at := &attempt{gen: gen, base: p.base, local: local, offset: offset, fwd: p.fwd, asker: p.asker, stackDir: stackDir, done: p.done}
	if at.done == nil {
		at.done = func() {}
	}
	fwd := p.fwd
	if fwd == nil {
		an, err := stall.New(stall.Config{WorldSize: p.size, Cost: s.cost})
		if err != nil { // only an empty world fails, and then there is nothing to watch
			s.log.Warn("stall analysis off", "err", err)
		}
		at.an = an
	}
	s.mu.Lock()
	s.at, s.hung, s.known, s.steps, s.progress = at, false, nil, stepClock{}, time.Now()
	s.evid = nil
	s.heard.reset()
	s.unjudged = ""
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

// End ends the attempt: late events are ignored, and a follower stops
// forwarding.
func (s *Watch) End() {
	s.mu.Lock()
	at := s.at
	s.at = nil
	s.mu.Unlock()
	if at != nil {
		at.done()
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

// Worker is the Worker of a global rank (the exporter's Config.Worker).
func (s *Watch) Worker(rank int) telemetry.Worker {
	s.mu.Lock()
	defer s.mu.Unlock()
	if w, ok := s.workers[rank]; ok {
		return w
	}
	return telemetry.Worker{Rank: rank, LocalRank: -1, GPUIndex: -1}
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
	if at.fwd != nil {
		at.fwd.Send(recs)
		return
	}
	s.analyze(at, recs)
}

// Records, Workers and Stacks are the leader's relay.Handler: what the
// followers send.
func (s *Watch) Records(node string, recs []telemetry.Record) {
	s.mu.Lock()
	s.heard.from(node, time.Now())
	s.mu.Unlock()
	if at := s.current(); at != nil && at.an != nil {
		s.analyze(at, recs)
	}
}

// Workers records the workers of another node, for reports and spans.
func (s *Watch) Workers(node string, ws []telemetry.Worker) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ranks := make([]int, 0, len(ws))
	for _, w := range ws {
		if s.workers != nil {
			s.workers[w.Rank] = w
		}
		ranks = append(ranks, w.Rank)
	}
	s.heard.from(node, time.Now(), ranks...)
}

// Stacks takes the Python stacks another node sent for a hang.
func (s *Watch) Stacks(node string, stacks map[int]string) {
	select {
	case s.remote <- stacks:
	default:
		s.log.Warn("Python stacks from another node dropped: too many at once", "node", node)
	}
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

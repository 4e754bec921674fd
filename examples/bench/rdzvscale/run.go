package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime/trace"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// phase is one measured phase of a run (open, round, re-form): its wall
// time, the server's and this process's CPU, and with -detail the agents'
// requests and the server's counters.
type phase struct {
	name           string
	wall           time.Duration
	srvCPU, cliCPU time.Duration
	ops            *opStats
	metrics        map[string]float64 // deltas
	srvRSS         uint64             // server RSS at the end of the phase
}

// result is one run of one configuration.
type result struct {
	n, k, m             int // agents, clients, etcd members
	ok                  bool
	failed              string // which phase failed, and why
	open, round, reform time.Duration
	roundFirst          time.Duration // the first Next to return
	reformFirst         time.Duration
	srvHWM              uint64
	srvCPU              time.Duration
	cores               float64 // what the CPU probe before the run got
	phases              []phase
	warns               map[string]int
	examples            map[string]string
	stateBytes          int // the state key's value once the round closed
}

// runOnce is one run of N agents on K clients against a fresh etcd child
// of M members: open, round, then re-form after an injected fault. It
// never fails: a failure is in the result, with its phase.
func runOnce(ctx context.Context, o options, kk key, run int) (res result) {
	n, k := kk.n, kk.k
	res = result{n: n, k: k, m: kk.m}
	warns := newTally()
	defer func() { res.warns, res.examples = warns.counts() }()
	fail := func(ph string, err error) result {
		res.failed = ph + ": " + err.Error()
		return res
	}

	res.cores = cpuProbe(300 * time.Millisecond)
	prof, lockprof := serverProfiles(o, kk, run)
	srv, err := startServer(o, kk.m, prof, lockprof, warns)
	if err != nil {
		return fail("start etcd", err)
	}
	defer srv.stop()

	var next slog.Handler
	if o.verbose {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})
	}
	agentLog := slog.New(&countHandler{t: warns, who: "agent", next: next})
	clientLog := slog.New(&countHandler{t: warns, who: "etcd client", next: next})
	prefix := rdzv.Prefix(rdzv.RootPrefix, jobID)
	tp := &tap{prefix: prefix}

	clis, err := dialClients(ctx, o.timeout, srv.endpoints, k, clientLog)
	defer closeClients(clis)
	if err != nil {
		return fail("dial", err)
	}
	if o.detail {
		tapClients(clis, tp)
	}
	m := &meter{srv: srv, tp: tp, detail: o.detail, res: &res}
	srvCPU0 := srv.cpu()
	defer func() { res.srvCPU = srv.cpu() - srvCPU0; _, res.srvHWM = srv.mem() }()

	agents := newAgents(n)
	defer closeAgents(agents)
	end := m.begin("open")
	res.open, err = openAll(ctx, o, agents, clis, srv.endpoint(), prefix, agentLog)
	end()
	if err != nil {
		return fail("open", err)
	}

	f := follow(ctx, agents)
	defer f.stop()
	if o.trace != "" && run == o.runs {
		defer startTrace(o.trace)()
	}
	if res.round, res.roundFirst, err = measureRound(o, m, f, agents); err != nil {
		return fail("round", err)
	}
	res.stateBytes = stateSize(ctx, clis[0], prefix)

	if !sleepCtx(ctx, o.settle) {
		return fail("re-form", context.Cause(ctx))
	}
	if res.reform, res.reformFirst, err = measureReform(o, m, f, agents); err != nil {
		return fail("re-form", err)
	}
	res.ok = true
	return res
}

// serverProfiles are the paths of the etcd child's CPU and lock profiles
// of this run, empty when not asked for: PREFIX.etcd.nN.kK.rR, with .mM
// before .rR for a cluster of M > 1 members (whose child process holds
// them all, so its profile is of them all).
func serverProfiles(o options, kk key, run int) (prof, lockprof string) {
	name := fmt.Sprintf(".etcd.n%d.k%d.r%d", kk.n, kk.k, run)
	if kk.m > 1 {
		name = fmt.Sprintf(".etcd.n%d.k%d.m%d.r%d", kk.n, kk.k, kk.m, run)
	}
	if o.cpuprof != "" {
		prof = o.cpuprof + name
	}
	if o.lockprof != "" {
		lockprof = o.lockprof + name
	}
	return prof, lockprof
}

// startTrace writes this process's execution trace to path until the
// returned func is called; nothing if the file cannot be created.
func startTrace(path string) (stop func()) {
	f, err := os.Create(path)
	if err != nil {
		return func() {}
	}
	if trace.Start(f) != nil {
		f.Close()
		return func() {}
	}
	return func() { trace.Stop(); f.Close() }
}

// meter brackets the phases of a run with the server's and this process's
// CPU, and with -detail the agents' requests and the server's counters;
// each phase is appended to res.
type meter struct {
	srv    *server
	tp     *tap
	detail bool
	res    *result
}

// begin starts measuring a phase; the func it returns ends it.
func (m *meter) begin(name string) (end func() phase) {
	p := phase{name: name}
	var m0 map[string]float64
	if m.detail {
		// A cluster's: the first member's /metrics, which are all
		// members' together (see scrape).
		m0 = scrape(m.srv.endpoints[0])
		p.ops = newOpStats()
		m.tp.cur.Store(p.ops)
	}
	s0, c0, t0 := m.srv.cpu(), selfCPU(), time.Now()
	return func() phase {
		p.wall = time.Since(t0)
		p.srvCPU, p.cliCPU = m.srv.cpu()-s0, selfCPU()-c0
		p.srvRSS, _ = m.srv.mem()
		if m.detail {
			m.tp.cur.Store(nil)
			p.metrics = metricDeltas(m0, scrape(m.srv.endpoints[0]))
		}
		m.res.phases = append(m.res.phases, p)
		return p
	}
}

// measureRound has every agent call Next at once, and returns the time to
// the last and to the first return, once the round checks out.
func measureRound(o options, m *meter, f *followers, agents []*agent) (last, first time.Duration, err error) {
	n := len(agents)
	end := m.begin("round")
	stop := time.AfterFunc(o.timeout, f.rcancel)
	t0 := time.Now()
	f.startAll()
	ok := waitBounded(&f.roundWG, o.timeout+15*time.Second)
	stop.Stop()
	end()
	if !ok {
		return 0, 0, fmt.Errorf("Next did not return within %v", o.timeout+15*time.Second)
	}
	errs := make([]error, n)
	for i, a := range agents {
		errs[i] = a.err1
	}
	if err := firstErrors(errs); err != nil {
		return 0, 0, err
	}
	last, first = spread(t0, agents, func(a *agent) time.Time { return a.t1 })
	if err := checkRound(agents, n, o.nproc, func(a *agent) *rdzv.Round { return a.r1 }, nil); err != nil {
		return last, first, err
	}
	return last, first, nil
}

// measureReform has an agent in the middle of the list fail its round, and
// returns the time to the last and the first agent holding the next round,
// once every agent does and the round checks out.
func measureReform(o options, m *meter, f *followers, agents []*agent) (last, first time.Duration, err error) {
	n := len(agents)
	end := m.begin("re-form")
	stop := time.AfterFunc(o.timeout, f.fcancel)
	t0 := time.Now()
	faulty := agents[n/2]
	ferr := faulty.e.Fail(f.fctx, faulty.r1, "rdzvscale: injected worker failure")
	var werr error
	if ferr == nil {
		werr = waitReformed(f.fctx, agents)
	}
	stop.Stop()
	end()
	if ferr != nil {
		return 0, 0, fmt.Errorf("Fail: %w", ferr)
	}
	if werr != nil {
		return 0, 0, werr
	}
	if err := checkOnce(agents, t0); err != nil {
		return 0, 0, err
	}
	last, first = spread(t0, agents, func(a *agent) time.Time { _, t, _ := a.latest(); return t })
	if err := checkRound(agents, n, o.nproc, func(a *agent) *rdzv.Round { r, _, _ := a.latest(); return r }, func(a *agent) *rdzv.Round { return a.r1 }); err != nil {
		return last, first, err
	}
	return last, first, nil
}

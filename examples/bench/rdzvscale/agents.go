package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
)

// agent is one simulated agent: its rendezvous, its first round and, from
// its goroutine, the rounds after the fault.
type agent struct {
	e    *rdzv.Membership
	r1   *rdzv.Round
	t1   time.Time
	err1 error

	// Written by the agent's goroutine during the re-formation.
	mu     sync.Mutex
	ended  time.Time // when r1's Done closed
	r2     *rdzv.Round
	t2     time.Time
	err2   error
	broken []string // why rounds after r1 ended (another fault during the re-formation)
}

// latest returns the agent's latest round of the re-formation.
func (a *agent) latest() (*rdzv.Round, time.Time, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.r2, a.t2, a.err2
}

func newAgents(n int) []*agent {
	agents := make([]*agent, n)
	for i := range agents {
		agents[i] = &agent{}
	}
	return agents
}

// closeAgents ends the opened agents' rounds (their watches and
// keep-alives) and rendezvous, bounded by 10 s.
func closeAgents(agents []*agent) {
	var wg sync.WaitGroup
	for _, a := range agents {
		if a.e == nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			r2, _, _ := a.latest()
			for _, r := range []*rdzv.Round{a.r1, r2} {
				if r != nil {
					r.Stop()
				}
			}
			a.e.Close()
		}()
	}
	waitBounded(&wg, 10*time.Second)
}

// openAll has every agent call rdzv.Open at once, agent i on client i mod
// K, and returns the time until the last one returned.
func openAll(ctx context.Context, o options, agents []*agent, clis []*etcdClient, endpoint, prefix string, log *slog.Logger) (time.Duration, error) {
	octx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	n, k := len(agents), len(clis)
	var wg sync.WaitGroup
	errs := make([]error, n)
	t0 := time.Now()
	for i, a := range agents {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cfg := rdzv.Config{
				JobID: jobID, Prefix: prefix, Hosted: i == 0, Endpoint: endpoint,
				Host: fmt.Sprintf("node%05d", i), Addr: "127.0.0.1", NProc: o.nproc,
				NNodesMin: n, NNodesMax: n, MaxRestarts: 100,
				JoinTimeout: o.timeout, LastCall: time.Second, TTL: o.ttl,
				Logger: log,
			}
			a.e, errs[i] = rdzv.Open(octx, clis[i%k], cfg)
		}()
	}
	ok := waitBounded(&wg, o.timeout+15*time.Second)
	took := time.Since(t0)
	if !ok {
		return took, fmt.Errorf("Open did not return within %v", o.timeout+15*time.Second)
	}
	return took, firstErrors(errs)
}

// followers are the agents' goroutines for the round and the re-formation:
// one per agent for both, so that each calls Next again as soon as its
// round ends, as real agents do.
type followers struct {
	rctx, fctx       context.Context // the first round's Next; the re-formation
	rcancel, fcancel context.CancelFunc
	start            chan struct{} // closed: every agent calls Next at once
	startOnce        sync.Once
	roundWG, allWG   sync.WaitGroup // the first Next returned; the goroutine returned
}

// follow starts one goroutine per agent, each waiting for startAll.
func follow(ctx context.Context, agents []*agent) *followers {
	f := &followers{start: make(chan struct{})}
	f.rctx, f.rcancel = context.WithCancel(ctx)
	f.fctx, f.fcancel = context.WithCancel(ctx)
	for _, a := range agents {
		f.roundWG.Add(1)
		f.allWG.Add(1)
		go f.run(a)
	}
	return f
}

func (f *followers) startAll() { f.startOnce.Do(func() { close(f.start) }) }

// stop ends the goroutines (started or not) and waits for them, at most 15 s.
func (f *followers) stop() {
	f.rcancel()
	f.fcancel()
	f.startAll()
	waitBounded(&f.allWG, 15*time.Second)
}

// run is one agent's goroutine: Next at the start signal, then, following
// the job as a real agent does, Next again whenever the round ends.
func (f *followers) run(a *agent) {
	defer f.allWG.Done()
	<-f.start
	a.r1, a.err1 = a.e.Next(f.rctx)
	a.t1 = time.Now()
	f.roundWG.Done()
	if a.err1 != nil {
		return
	}
	r := a.r1
	for {
		select {
		case <-r.Done():
		case <-f.fctx.Done():
			return
		}
		a.mu.Lock()
		if r == a.r1 {
			a.ended = time.Now()
		} else {
			a.broken = append(a.broken, r.Reason())
		}
		a.mu.Unlock()
		nr, err := a.e.Next(f.fctx)
		a.mu.Lock()
		a.r2, a.t2, a.err2 = nr, time.Now(), err
		a.mu.Unlock()
		if err != nil {
			return
		}
		r = nr
	}
}

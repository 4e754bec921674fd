package agent

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// stragglerPolicy carries out --straggler-action: it is the watch's
// OnStragglers, confirms the persistent stragglers it is given
// (stragglerClock, pure) and acts on the confirmed one. The watch calls it
// from its goroutines and it must not block: the one step that may (the
// store read for spares) runs in the background.
type stragglerPolicy struct {
	log         *slog.Logger
	action      StragglerAction
	confirm     time.Duration
	minNodes    int
	maxRestarts int
	now         func() time.Time
	report      func(*Fault)          // the fault queue, for a restart
	drain       func(*StragglerError) // ends the run with this node drained
	// spares counts the nodes waiting in the rendezvous to take a place;
	// nil when the rendezvous has none (static, standalone).
	spares func(context.Context) (int, error)
	// owner names the node that runs a rank ("node-b"), "" when unknown.
	owner      func(rank int) string
	background func(func())    // runs f off the watch's goroutine; Run waits for it
	runCtx     context.Context // the run's: it bounds the background work
	// readNamed reads the stragglers the leader published (a follower's
	// source, straggler_action_follow.go); nil without a store.
	readNamed func(context.Context) ([]telemetry.Straggler, error)

	mu         sync.Mutex
	clock      stragglerClock
	at         *stragglerAttempt // nil between attempts
	localLooks bool              // this attempt's own watch names stragglers: it analyzes its ranks itself
	stopFollow func()            // ends the attempt's reads of the leader's stragglers
}

// stragglerAttempt is what the policy needs of the running attempt.
type stragglerAttempt struct {
	gen        uint64
	nodes      int // in this generation
	rankOffset int // this node's ranks are [rankOffset, rankOffset+nproc)
	nproc      int
	restarts   int  // faults the job has had so far
	follower   bool // another node's agent leads the analysis
}

func (at *stragglerAttempt) local(rank int) bool {
	return rank >= at.rankOffset && rank < at.rankOffset+at.nproc
}

// newStragglerPolicy builds the policy of a run; drain ends the run (its
// context's cancel) with the drain as the cause.
func (a *Agent) newStragglerPolicy(ctx context.Context, s *session, drain func(*StragglerError)) *stragglerPolicy {
	tc := a.cfg.Telemetry
	p := &stragglerPolicy{
		log: a.log, action: tc.StragglerAction, confirm: tc.StragglerConfirm,
		minNodes: a.cfg.Rendezvous.NNodesMin, maxRestarts: a.cfg.MaxRestarts, now: time.Now,
		report: s.faults.report, drain: drain, background: s.goBackground, runCtx: ctx,
		owner: func(rank int) string { return s.watch.Worker(rank).Host },
	}
	if p.action == "" {
		p.action = StragglerLog
	}
	if p.confirm <= 0 {
		p.confirm = DefaultStragglerConfirm
	}
	if r := a.cfg.Rendezvous; r.Dynamic && !r.Standalone {
		p.spares = func(ctx context.Context) (int, error) { return a.countSpares(ctx, s) }
		p.readNamed = a.publishedStragglers(s)
	}
	return p
}

// begin starts confirming the stragglers of a new attempt: what was
// confirmed in the last one does not carry over.
func (p *stragglerPolicy) begin(at stragglerAttempt) {
	p.mu.Lock()
	p.at = &at
	p.clock = stragglerClock{}
	p.localLooks = false
	p.mu.Unlock()
	p.follow(at)
}

// end stops acting on the attempt: its workers are being stopped.
func (p *stragglerPolicy) end() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = nil
	if p.stopFollow != nil {
		p.stopFollow()
		p.stopFollow = nil
	}
}

// look is the watch's OnStragglers: the persistent stragglers named now.
func (p *stragglerPolicy) look(named []telemetry.Straggler) {
	p.lookAt(0, named, true)
}

// lookAt confirms named: from this node's watch (local), or the leader's
// published list for generation gen. Once the watch itself names
// stragglers in an attempt (it analyzes its own ranks: the leader could
// not be reached), the leader's list is ignored: the clock needs one
// source.
func (p *stragglerPolicy) lookAt(gen uint64, named []telemetry.Straggler, local bool) {
	p.mu.Lock()
	at := p.at
	if at == nil || !local && (gen != at.gen || p.localLooks) {
		p.mu.Unlock()
		return
	}
	p.localLooks = p.localLooks || local
	// Read under the lock: two of the watch's goroutines look, and the
	// clock needs its looks in order.
	d, ok := p.clock.look(at.gen, p.now(), named, p.action, p.confirm)
	p.mu.Unlock()
	if ok {
		p.act(*at, d)
	}
}

// act carries out the decision for the attempt at.
func (p *stragglerPolicy) act(at stragglerAttempt, d stragglerDecision) {
	se := &StragglerError{Straggler: d.Straggler, Confirm: p.confirm, Action: d.Action}
	st := d.Straggler
	attrs := []any{"rank", st.Rank, "cause", string(st.Cause), "named", d.Named.Round(time.Second), "generation", at.gen}
	switch d.Action {
	case StragglerRestart:
		if at.restarts >= p.maxRestarts {
			// A slow job is better than a failed one: with no restarts
			// left, the restart would end the job.
			p.logOnly(se, fmt.Sprintf("restart refused: no restarts left (%d of --max-restarts %d used)", at.restarts, p.maxRestarts), attrs)
			return
		}
		p.log.Error(fmt.Sprintf("persistent straggler %s; action restart: restarting the job", se.what()), attrs...)
		p.report(stragglerFault(at.gen, p.now(), se))
	case StragglerDrain:
		p.tryDrain(at, se, attrs)
	default:
		p.logOnly(se, "", attrs)
	}
}

// logOnly is the log action, and what a refused restart or drain falls
// back to: one line, nothing done.
func (p *stragglerPolicy) logOnly(se *StragglerError, refused string, attrs []any) {
	msg := fmt.Sprintf("persistent straggler rank %d confirmed for %s; action log: nothing done", se.Straggler.Rank, durationText(se.Confirm))
	if refused != "" {
		msg = fmt.Sprintf("persistent straggler rank %d confirmed for %s; %s; action log: nothing done", se.Straggler.Rank, durationText(se.Confirm), refused)
	}
	p.log.Warn(msg, attrs...)
}

// spareTimeout bounds the store read that counts the spares.
const spareTimeout = 5 * time.Second

// tryDrain drains this node for se when the straggler is one of its ranks
// and the job can go on without it; otherwise it says why not and only
// logs.
func (p *stragglerPolicy) tryDrain(at stragglerAttempt, se *StragglerError, attrs []any) {
	dc := drainCheck{Rank: se.Straggler.Rank, Local: at.local(se.Straggler.Rank), Nodes: at.nodes, Min: p.minNodes}
	if !dc.Local {
		dc.Owner = "another node"
		if h := p.owner(dc.Rank); h != "" {
			dc.Owner = "node " + h
		}
	}
	if !dc.needsSpares() || p.spares == nil { // without spares (fixed nodes) nobody can take this one's place
		p.drainOr(dc, se, attrs)
		return
	}
	p.background(func() {
		ctx, cancel := context.WithTimeout(p.runCtx, spareTimeout)
		defer cancel()
		n, err := p.spares(ctx)
		if p.runCtx.Err() != nil { // the run ended meanwhile: nothing left to drain
			return
		}
		if err != nil {
			p.log.Warn("count the spare nodes in the rendezvous: taken as none", "err", err)
		}
		dc.Spares = n
		p.drainOr(dc, se, attrs)
	})
}

// drainOr drains this node when dc allows it, and logs the refusal
// otherwise.
func (p *stragglerPolicy) drainOr(dc drainCheck, se *StragglerError, attrs []any) {
	if why := dc.refusal(); why != "" {
		p.logOnly(se, why, attrs)
		return
	}
	p.log.Error(fmt.Sprintf("persistent straggler %s; action drain: this node leaves the job (%d nodes, MIN %d, %d spare(s))",
		se.what(), dc.Nodes, dc.Min, max(dc.Spares, 0)), attrs...)
	p.drain(se)
}

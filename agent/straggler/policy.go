package straggler

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Config is what a Policy needs of the run it acts in.
type Config struct {
	Log         *slog.Logger
	Action      Action        // "": ActionLog
	Confirm     time.Duration // the confirmation window; 0: DefaultConfirm
	MinNodes    int           // --nnodes MIN
	MaxRestarts int
	Now         func() time.Time // nil: time.Now
	// Restart reports a fault for se, confirmed at seen, that restarts the
	// attempt of generation gen (the agent's fault queue); it must not
	// block.
	Restart func(gen uint64, seen time.Time, se *Error)
	// Drain ends the run with this node drained, se its cause.
	Drain func(se *Error)
	// Owner names the node that runs a rank ("node-b"), "" when unknown.
	Owner func(rank int) string
	// Background runs f on its own goroutine; the run waits for it.
	Background func(f func())
	// JobStatus reads the job as `ddp-agent status` shows it: the spares a
	// drain may need, the stragglers a follower reads. nil when the
	// rendezvous has no store (static, standalone).
	JobStatus func(context.Context) (*rdzv.Status, error)
}

// Policy carries out --straggler-action: its Look is the watch's
// OnStragglers, confirms the persistent stragglers it is given (clock,
// pure) and acts on the confirmed one. The watch calls it from its
// goroutines and it must not block: the one step that may (the store read
// for spares) runs in the background. Its methods are safe to call
// concurrently.
type Policy struct {
	log         *slog.Logger
	action      Action
	confirm     time.Duration
	minNodes    int
	maxRestarts int
	now         func() time.Time
	restart     func(gen uint64, seen time.Time, se *Error) // the fault queue, for a restart
	drain       func(*Error)                                // ends the run with this node drained
	// spares counts the nodes waiting in the rendezvous to take a place;
	// nil when the rendezvous has none (static, standalone).
	spares func(context.Context) (int, error)
	// owner names the node that runs a rank ("node-b"), "" when unknown.
	owner      func(rank int) string
	background func(func())    // runs f off the watch's goroutine; Run waits for it
	runCtx     context.Context // the run's: it bounds the background work
	// readNamed reads the stragglers the leader published (a follower's
	// source, follow.go); nil without a store.
	readNamed func(context.Context) ([]telemetry.Straggler, error)

	mu         sync.Mutex
	clock      clock
	at         *Attempt // nil between attempts
	localLooks bool     // this attempt's own watch names stragglers: it analyzes its ranks itself
	stopFollow func()   // ends the attempt's reads of the leader's stragglers
}

// Attempt is what the policy needs of the running attempt.
type Attempt struct {
	Gen        uint64
	Nodes      int // in this generation
	RankOffset int // this node's ranks are [RankOffset, RankOffset+NProc)
	NProc      int
	Restarts   int  // faults the job has had so far
	Follower   bool // another node's agent leads the analysis
}

func (at *Attempt) local(rank int) bool {
	return rank >= at.RankOffset && rank < at.RankOffset+at.NProc
}

// New returns the policy of a run; ctx is the run's, and bounds the
// policy's background work (the spare count, a follower's reads).
func New(ctx context.Context, cfg Config) *Policy {
	p := &Policy{
		log: cfg.Log, action: cfg.Action, confirm: cfg.Confirm, minNodes: cfg.MinNodes, maxRestarts: cfg.MaxRestarts,
		now: cfg.Now, restart: cfg.Restart, drain: cfg.Drain, owner: cfg.Owner, background: cfg.Background, runCtx: ctx,
	}
	if p.action == "" {
		p.action = ActionLog
	}
	if p.confirm <= 0 {
		p.confirm = DefaultConfirm
	}
	if p.now == nil {
		p.now = time.Now
	}
	if cfg.JobStatus != nil {
		p.spares = countSpares(cfg.JobStatus)
		p.readNamed = publishedStragglers(cfg.JobStatus)
	}
	return p
}

// Begin starts confirming the stragglers of a new attempt: what was
// confirmed in the last one does not carry over.
func (p *Policy) Begin(at Attempt) {
	p.mu.Lock()
	p.at = &at
	p.clock = clock{}
	p.localLooks = false
	p.mu.Unlock()
	p.follow(at)
}

// End stops acting on the attempt: its workers are being stopped.
func (p *Policy) End() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.at = nil
	if p.stopFollow != nil {
		p.stopFollow()
		p.stopFollow = nil
	}
}

// Look is the watch's OnStragglers: the persistent stragglers named now.
func (p *Policy) Look(named []telemetry.Straggler) {
	p.lookAt(0, named, true)
}

// lookAt confirms named: from this node's watch (local), or the leader's
// published list for generation gen. Once the watch itself names
// stragglers in an attempt (it analyzes its own ranks: the leader could
// not be reached), the leader's list is ignored: the clock needs one
// source.
func (p *Policy) lookAt(gen uint64, named []telemetry.Straggler, local bool) {
	p.mu.Lock()
	at := p.at
	if at == nil || !local && (gen != at.Gen || p.localLooks) {
		p.mu.Unlock()
		return
	}
	p.localLooks = p.localLooks || local
	// Read under the lock: two of the watch's goroutines look, and the
	// clock needs its looks in order.
	d, ok := p.clock.look(at.Gen, p.now(), named, p.action, p.confirm)
	p.mu.Unlock()
	if ok {
		p.act(*at, d)
	}
}

// act carries out the decision for the attempt at.
func (p *Policy) act(at Attempt, d decision) {
	se := &Error{Straggler: d.Straggler, Confirm: p.confirm, Action: d.Action}
	st := d.Straggler
	attrs := []any{"rank", st.Rank, "cause", string(st.Cause), "named", d.Named.Round(time.Second), "generation", at.Gen}
	switch d.Action {
	case ActionRestart:
		if at.Restarts >= p.maxRestarts {
			// A slow job is better than a failed one: with no restarts
			// left, the restart would end the job.
			p.logOnly(se, fmt.Sprintf("restart refused: no restarts left (%d of --max-restarts %d used)", at.Restarts, p.maxRestarts), attrs)
			return
		}
		p.log.Error(se.Finding()+"; action restart: restarting the job", attrs...)
		p.restart(at.Gen, p.now(), se)
	case ActionDrain:
		p.tryDrain(at, se, attrs)
	default:
		p.logOnly(se, "", attrs)
	}
}

// logOnly is the log action, and what a refused restart or drain falls
// back to: one line, nothing done.
func (p *Policy) logOnly(se *Error, refused string, attrs []any) {
	msg := fmt.Sprintf("persistent straggler rank %d confirmed for %s; action log: nothing done", se.Straggler.Rank, durationText(se.Confirm))
	if refused != "" {
		msg = fmt.Sprintf("persistent straggler rank %d confirmed for %s; %s; action log: nothing done", se.Straggler.Rank, durationText(se.Confirm), refused)
	}
	p.log.Warn(msg, attrs...)
}

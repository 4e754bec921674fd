package watch

import (
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/stall"
	"github.com/ddp-agent/ddp-agent/wire"
)

// attempt is the analysis of one attempt: its records become collectives
// (with their stalls), its hang, and its persistent stragglers, by global
// rank. Begin makes one as the plan says (plan.go); a new attempt starts
// from nothing. Its methods decide and do no I/O beyond what they are
// given (readLocal): the Watch logs, exports and ends the attempt. Safe for
// concurrent use.
type attempt struct {
	gen      uint64
	an       *stall.Analyzer // nil on a follower
	base     int             // the global rank of the analyzer's rank 0
	local    []telemetry.Worker
	offset   int // global rank of local rank 0
	stackDir string
	plan     plan // this node's part: fwd, asker and done

	// readLocal reads the evidence of a worker of this node now
	// (Watch.localEvidence).
	readLocal func(telemetry.Worker) evidence

	mu       sync.Mutex
	workers  map[int]telemetry.Worker // this node's, and the others' as their agents sent them
	hung     bool                     // the hang was reported
	known    map[int]telemetry.Cause  // the persistent stragglers named at the last look, and their causes
	evid     map[int]evidence         // every rank's evidence for a straggler's cause, as read at evidAt
	evidAt   time.Time
	heard    heard  // the leader's: the other nodes' ranks, and when each last sent
	unjudged string // the ranks last left unjudged, logged once
	steps    stepClock
	// progress is when a collective last completed, on this agent's
	// monotonic clock: the workers' arrival times are wall-clock times,
	// and a clock step must not look like a hang.
	progress time.Time
	// began is when the attempt's analysis began (its workers started),
	// on the wall clock of the arrivals; completed: a collective of the
	// attempt has completed since (firstGrace).
	began     time.Time
	completed bool
}

// newAttempt starts the analysis of attempt gen as p plans it. It covers
// ranks [p.base, p.base+p.size): all of them on the leader (or a single
// node), this node's when the records cannot be gathered. A follower
// (p.fwd not nil) analyzes nothing: it forwards.
func newAttempt(gen uint64, p plan, local []telemetry.Worker, offset int, stackDir string, cost float64, log *slog.Logger) *attempt {
	at := &attempt{gen: gen, base: p.base, local: local, offset: offset, stackDir: stackDir, plan: p,
		workers: make(map[int]telemetry.Worker, len(local)), progress: time.Now(), began: time.Now()}
	if at.plan.done == nil {
		at.plan.done = func() {}
	}
	if p.fwd == nil {
		an, err := stall.New(stall.Config{WorldSize: p.size, Cost: cost})
		if err != nil { // only an empty world fails, and then there is nothing to watch
			log.Warn("stall analysis off", "err", err)
		}
		at.an = an
	}
	at.heard.reset()
	for _, w := range local {
		at.workers[w.Rank] = w
	}
	return at
}

// oneNode is heard.oneNode for this attempt's ranks.
func (at *attempt) oneNode(missing []int) string {
	at.mu.Lock()
	defer at.mu.Unlock()
	return at.heard.oneNode(missing, at.offset, at.offset+len(at.local))
}

// isLocal reports whether global rank r runs on this node.
func (at *attempt) isLocal(r int) bool { return r >= at.offset && r < at.offset+len(at.local) }

// worker is the Worker of a global rank.
func (at *attempt) worker(rank int) telemetry.Worker {
	at.mu.Lock()
	defer at.mu.Unlock()
	if w, ok := at.workers[rank]; ok {
		return w
	}
	return unknownWorker(rank)
}

func unknownWorker(rank int) telemetry.Worker {
	return telemetry.Worker{Rank: rank, LocalRank: -1, GPUIndex: -1}
}

// heardFrom records that node sent something now, and that ws run there.
func (at *attempt) heardFrom(node string, now time.Time, ws ...telemetry.Worker) {
	at.mu.Lock()
	defer at.mu.Unlock()
	ranks := make([]int, 0, len(ws))
	for _, w := range ws {
		at.workers[w.Rank] = w
		ranks = append(ranks, w.Rank)
	}
	at.heard.from(node, now, ranks...)
}

// describe is "5 (node-b, GPU 1, pid 4411)".
func (at *attempt) describe(rank int) string {
	return describe(rank, at.worker(rank))
}

func describe(rank int, w telemetry.Worker) string {
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

// add feeds records of global ranks to the analyzer and returns the
// collectives they complete, by global rank (their stalls' stragglers
// too). Records of another generation, and of the script's own
// collectives (telemetry.Script), are dropped.
func (at *attempt) add(recs []telemetry.Record) []telemetry.Collective {
	if at.an == nil {
		return nil
	}
	var done []telemetry.Collective
	for _, r := range recs {
		if r.Gen != at.gen || telemetry.Script(r.Bucket) {
			continue
		}
		r.Rank -= at.base
		if r.IsMark() {
			if r.Bucket == wire.MarkForward {
				at.an.Mark(r.Gen, r.Rank, r.Step, r.Arrive)
			}
			continue
		}
		done = append(done, at.an.Add(r)...)
	}
	if len(done) == 0 {
		return nil
	}
	at.mu.Lock()
	at.progress, at.completed = time.Now(), true
	at.mu.Unlock()
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
			at.mu.Lock()
			at.steps.observe(c.Step, first)
			at.mu.Unlock()
		}
		if c.Stall != nil {
			c.Stall.Straggler += at.base
		}
	}
	return done
}

// timeout is the hang timeout now: flag, or with auto the longer of it
// and 10 × the median step time (a job whose steps take minutes must not
// look hung at 60 s).
func (at *attempt) timeout(flag time.Duration, auto bool) time.Duration {
	if !auto {
		return flag
	}
	at.mu.Lock()
	defer at.mu.Unlock()
	return max(flag, 10*at.steps.median())
}

// rearm abandons the attempt's incomplete collectives and lets a hang be
// found again, timed from now (Watch.HangReplaced).
func (at *attempt) rearm() {
	if at.an != nil {
		at.an.Abandon()
	}
	at.mu.Lock()
	defer at.mu.Unlock()
	at.hung, at.progress = false, time.Now()
}

// firstGrace is how long the attempt's first collective may wait, at
// least, before it is a hang: as long as its first rank took to come to it
// from the attempt's start. Ranks reach their first all-reduce after
// whatever each does first (torch.compile and its autotuning, loading the
// first batch, NCCL's set-up), and a rank twice as slow there as the
// first is no hang; a rank that never comes is one, at the timeout or at
// this, whichever is later. Nothing once a collective completed.
func firstGrace(completed bool, began, firstArrival time.Time) time.Duration {
	if completed {
		return 0
	}
	return max(0, firstArrival.Sub(began))
}

// hangVerdict is what a look for a hang found: nothing (Hang nil), a hang
// to report, or a collective unfinished past the timeout whose missing
// ranks this node cannot judge (Unjudged, and Why; Log the first time
// these ranks are left so): no hang to report.
type hangVerdict struct {
	Hang     *telemetry.Hang
	Unjudged []int
	Why      string
	Log      bool
}

// hang decides, at now, whether the attempt hung: nothing completed for
// timeout (in a hang nothing completes: DDP's ranks move in step) and a
// collective waits for ranks this node can judge. A hang is found once:
// the attempt is marked hung.
func (at *attempt) hang(now time.Time, timeout time.Duration) hangVerdict {
	if at.an == nil {
		return hangVerdict{}
	}
	at.mu.Lock()
	quiet := time.Since(at.progress)
	at.mu.Unlock()
	if quiet < timeout {
		return hangVerdict{}
	}
	h := at.an.Hang(now, timeout)
	if h == nil {
		return hangVerdict{}
	}
	at.mu.Lock()
	grace := firstGrace(at.completed, at.began, h.Since)
	at.mu.Unlock()
	if now.Sub(h.Since) < grace {
		return hangVerdict{}
	}
	for i := range h.Waiting {
		h.Waiting[i] += at.base
	}
	for i := range h.Missing {
		h.Missing[i] += at.base
	}
	at.mu.Lock()
	defer at.mu.Unlock()
	if at.hung {
		return hangVerdict{}
	}
	// The records of another node's ranks are missing because that node
	// never reported, or stopped: no hang this agent can judge (and under
	// a sidecar the ranks may be training on).
	if gone, why := at.heard.unjudged(h.Missing, at.offset, at.offset+len(at.local), time.Now()); len(gone) > 0 {
		line := rankList(gone)
		first := at.unjudged != line
		at.unjudged = line
		return hangVerdict{Hang: h, Unjudged: gone, Why: why, Log: first}
	}
	at.hung = true
	return hangVerdict{Hang: h}
}

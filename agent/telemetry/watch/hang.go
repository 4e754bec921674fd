package watch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// HangError ends an attempt whose collective hung.
type HangError struct {
	Hang   telemetry.Hang
	Report string // the paragraph that was logged, stacks included
	// Node is the one other node on which every rank that never arrived
	// runs, as its agent named itself to this one (a leader's); "" when
	// one runs here, or they run on several nodes.
	Node string
	// Remote: a follower's copy of the leader's hang (Config.OnRemoteHang),
	// for a decision of its own about its ranks; not reported here.
	Remote bool
}

func (e *HangError) Error() string {
	return fmt.Sprintf("collective hung in step %d bucket %d: %s never arrived", e.Hang.Step, e.Hang.Bucket, rankList(e.Hang.Missing))
}

// lookEvery is how often Run looks for hangs and persistent stragglers.
// The straggler test over a window of 40 steps costs microseconds, and at
// a step of 100 ms a look once a second would add up to ten steps to the
// detection.
const lookEvery = 250 * time.Millisecond

// Run checks for hangs and new persistent stragglers every lookEvery
// until ctx ends.
func (s *Watch) Run(ctx context.Context) {
	t := time.NewTicker(lookEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if s.cfg.HangTimeout > 0 {
				s.checkHang(ctx, now)
			}
			s.noteStragglers()
		}
	}
}

// HangReplaced tells the watch that the attempt's hang was dealt with in
// place: the ranks that never arrived were killed for warm spares to take,
// and the others re-form in process. The hung collectives are abandoned,
// and the next hang is looked for from now, reported as the first was.
func (s *Watch) HangReplaced() {
	if at := s.current(); at != nil {
		at.rearm()
	}
}

// timeout is at's hang timeout now (Config.HangTimeout, HangAuto).
func (s *Watch) timeout(at *attempt) time.Duration {
	return at.timeout(s.cfg.HangTimeout, s.cfg.HangAuto)
}

// checkHang reports the attempt's hang, once: it logs the ranks that
// never arrived with their Python stacks, exports it, and ends the attempt
// through OnHang.
func (s *Watch) checkHang(ctx context.Context, now time.Time) {
	at := s.current()
	if at == nil || at.an == nil {
		return
	}
	v := at.hang(now, s.timeout(at))
	if v.Hang == nil || s.current() != at { // none, or the attempt ended meanwhile
		return
	}
	h := v.Hang
	if len(v.Unjudged) > 0 {
		if v.Log {
			line := rankList(v.Unjudged)
			s.log.Warn("collective unfinished past the hang timeout, but not judged a hang: the records of "+line+" are missing because "+v.Why,
				"step", h.Step, "bucket", h.Bucket, "generation", h.Gen, "ranks", line)
		}
		return
	}
	stacks := s.hangStacks(ctx, at, *h)
	report := hangReport(at, *h, now, stacks, noStackReasons(at, h.Missing, stacks))
	s.logHang(*h, report)
	s.mu.Lock()
	s.lastHang, s.dirty = report, true // status prints it after "hang: "
	s.mu.Unlock()
	if s.exp != nil {
		s.exp.Hang(*h, stacks)
	}
	// Under the lock, so that an attempt that ended while the stacks were
	// collected is not ended again (OnHang never blocks).
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.at == at && s.cfg.OnHang != nil {
		s.cfg.OnHang(&HangError{Hang: *h, Report: report, Node: at.oneNode(h.Missing)})
	}
}

// hangStacks collects the Python stacks of h's missing ranks: this node's
// directly, the others' through the followers (bounded by stackWait and a
// second for the trip).
func (s *Watch) hangStacks(ctx context.Context, at *attempt, h telemetry.Hang) map[int]string {
	remote := 0
	for _, r := range h.Missing {
		if !at.isLocal(r) {
			remote++
		}
	}
	asker := at.plan.asker
	if remote > 0 && asker != nil {
		asker.RequestStacks(h)
	}
	stacks := s.stacks(ctx, at, h.Missing)
	if remote == 0 || asker == nil {
		return stacks
	}
	deadline := time.After(stackWait + time.Second)
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
			return stacks
		case <-ctx.Done():
			return stacks
		}
	}
	return stacks
}

// noStackReasons says, for each local rank among missing that gave no
// stack, why, where its process's state tells (whyNoStack).
func noStackReasons(at *attempt, missing []int, stacks map[int]string) map[int]string {
	why := map[int]string{}
	for _, r := range missing {
		if _, ok := stacks[r]; !ok && at.isLocal(r) {
			if w := whyNoStack(at.worker(r).PID); w != "" {
				why[r] = w
			}
		}
	}
	return why
}

// hangReport is the paragraph a person can act on: which collective, who
// waits, who never arrived, and the missing ranks' Python stacks, or why
// there is none.
func hangReport(at *attempt, h telemetry.Hang, now time.Time, stacks, why map[int]string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "step %d bucket %d (generation %d) has not finished %s after the first rank arrived; ",
		h.Step, h.Bucket, h.Gen, seconds(now.Sub(h.Since)))
	fmt.Fprintf(&b, "waiting: %s; ", rankList(h.Waiting))
	if len(h.Missing) == 0 {
		b.WriteString("every rank analyzed here arrived: the missing ranks are on other nodes")
	} else {
		descs := make([]string, len(h.Missing))
		for i, r := range h.Missing {
			descs[i] = "rank " + at.describe(r)
		}
		fmt.Fprintf(&b, "never arrived: %s", strings.Join(descs, ", "))
	}
	// What follows (a restart, or the job's end) is the agent's to say:
	// it may have no restarts left, and a sidecar never restarts.
	b.WriteString(". Aborting the communicators.")
	for _, r := range h.Missing {
		if st, ok := stacks[r]; ok {
			fmt.Fprintf(&b, "\nPython stack of rank %d:\n%s", r, strings.TrimRight(st, "\n"))
		} else if w := why[r]; w != "" {
			fmt.Fprintf(&b, "\nno Python stack from rank %d: %s", r, w)
		} else {
			fmt.Fprintf(&b, "\nno Python stack from rank %d (it did not register ddp_agent's hook, or did not answer in time)", r)
		}
	}
	return b.String()
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

// logHang logs report in one record, one line: its first paragraph, and
// the missing ranks' Python stacks (many lines each) as an attribute,
// escaped, for whatever reads the log. On a terminal (Config.Console) the
// stacks follow the record instead, as they are, readable. With a
// Config.ReportDir the whole report is also written to a file there, which
// the record names.
func (s *Watch) logHang(h telemetry.Hang, report string) {
	summary, stacks, _ := strings.Cut(report, "\n")
	attrs := []any{"step", h.Step, "bucket", h.Bucket, "generation", h.Gen}
	if dir := s.cfg.ReportDir; dir != "" {
		file := filepath.Join(dir, fmt.Sprintf("hang-gen%d-step%d-bucket%d.txt", h.Gen, h.Step, h.Bucket))
		if err := os.WriteFile(file, []byte(report+"\n"), 0o644); err != nil {
			attrs = append(attrs, "stacks_file_err", err.Error())
		} else {
			attrs = append(attrs, "stacks_file", file)
		}
	}
	if stacks != "" && s.cfg.Console == nil {
		attrs = append(attrs, "stacks", stacks)
	}
	s.log.Error("hang: "+summary, attrs...)
	if stacks != "" && s.cfg.Console != nil {
		fmt.Fprintf(s.cfg.Console, "%s\n", stacks)
	}
}

package rootcause

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// Host is what the report reads of the host monitor: the state of each
// worker and of the node when the attempt failed. *hostmon.Monitor is one.
type Host interface {
	Worker(rank int) (hostmon.WorkerSample, bool)
	Node() hostmon.NodeSample
}

var _ Host = (*hostmon.Monitor)(nil)

// LogAttrs are the attributes of the log line that says a worker failed:
// the root's rank, the attempt, the root's exit (how long after started)
// or whether it is this node's, and the victims.
func (b Blame) LogAttrs(attempt int, started time.Time) []any {
	attrs := []any{"rank", b.Root, "attempt", attempt}
	if e := b.Exit; e != nil {
		attrs = append(attrs, "local_rank", e.LocalRank, "pid", e.PID, "exit_code", e.Code, "signal", signalName(e),
			"after", e.Time.Sub(started).Round(time.Millisecond))
		if e.SparePID != 0 {
			attrs = append(attrs, "spare_pid", e.SparePID)
		}
	} else {
		attrs = append(attrs, "local", b.Local)
	}
	if len(b.Victims) > 0 {
		attrs = append(attrs, "victims", b.VictimRanks())
	}
	return attrs
}

// Format is the root cause of a failed attempt, whose workers have
// stopped, as one block a person can act on: who failed first and how,
// what it said last, which ranks failed only because of it, and the state
// of every worker (pids, by rank) and of the node when it happened.
func Format(b Blame, attempt, maxRestarts int, started time.Time, pids map[int]int, mon Host) string {
	var s strings.Builder
	fmt.Fprintf(&s, "==== ddp-agent: root cause (attempt %d, restarts used %d of %d) ====\n", attempt, attempt, maxRestarts)
	if e := b.Exit; e != nil {
		fmt.Fprintf(&s, "  %v, %s after start\n", e, e.Time.Sub(started).Round(time.Millisecond))
		if e.SparePID != 0 {
			fmt.Fprintf(&s, "  a warm spare (pid %d) took its rank, and the other workers never re-formed with it "+
				"(a script without ddp_agent.InProcess cannot)\n", e.SparePID)
		}
	} else {
		fmt.Fprintf(&s, "  %s\n", b.rootLine())
		if !b.Local && b.Root >= 0 {
			s.WriteString("  (its own node's agent reports it)\n")
		}
	}
	if b.Note != nil {
		fmt.Fprintf(&s, "  its collective failed after %s %s: %s\n", rankName(b.Note.Peer), peerDid(b.Note.Kind), b.Note.Message)
	}
	writeLastWords(&s, b.Exit)
	if len(b.Victims) > 0 {
		s.WriteString("  failed only because of another rank (victims, not root causes):\n")
		for _, l := range b.victimLines() {
			fmt.Fprintf(&s, "    %s\n", l)
		}
		for _, v := range b.Victims {
			fmt.Fprintf(&s, "    rank %d: %s\n", v.Rank, v.Note.Message)
		}
	}
	if len(b.Others) > 0 {
		s.WriteString("  also failed, later:\n")
		for _, e := range b.Others {
			fmt.Fprintf(&s, "    %v, %s after start\n", e, e.Time.Sub(started).Round(time.Millisecond))
		}
	}
	writeWorkers(&s, pids, mon)
	return s.String()
}

// writeLastWords writes what a worker that exited left: its error file
// and the end of its stderr.
func writeLastWords(s *strings.Builder, e *supervisor.WorkerExitError) {
	if e == nil {
		return
	}
	if e.ErrorFile != nil {
		fmt.Fprintf(s, "  error file: %s\n", e.ErrorFile.Message)
		if tb := strings.TrimRight(e.ErrorFile.Traceback, "\n"); tb != "" {
			s.WriteString("  traceback:\n")
			for _, l := range strings.Split(tb, "\n") {
				fmt.Fprintf(s, "    %s\n", l)
			}
		}
	}
	if len(e.StderrTail) > 0 {
		fmt.Fprintf(s, "  last %d stderr lines of rank %d:\n", len(e.StderrTail), e.Rank)
		for _, l := range e.StderrTail {
			fmt.Fprintf(s, "    %s\n", l)
		}
	}
}

// writeWorkers writes the state of every worker and of the node.
func writeWorkers(s *strings.Builder, pids map[int]int, mon Host) {
	ranks := make([]int, 0, len(pids))
	for r := range pids {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	s.WriteString("  workers at failure:\n")
	for _, r := range ranks {
		if st, ok := mon.Worker(r); ok {
			fmt.Fprintf(s, "    %s\n", st)
		} else {
			fmt.Fprintf(s, "    rank %d pid %d: not sampled yet\n", r, pids[r])
		}
	}
	fmt.Fprintf(s, "  %s\n", mon.Node())
}

func signalName(e *supervisor.WorkerExitError) string {
	if e.Signal == 0 {
		return ""
	}
	return e.Signal.String()
}

package agent

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

// report writes the root cause of a failed attempt to the agent's stderr as
// one block a person can act on: who failed and how, what it said last, and
// the state of every worker and of the node when it happened.
func (a *Agent) report(e *supervisor.WorkerExitError, attempt int, ran time.Duration, pids map[int]int, mon *hostmon.Monitor) {
	a.log.Error("worker failed", "rank", e.Rank, "local_rank", e.LocalRank, "pid", e.PID,
		"exit_code", e.Code, "signal", signalName(e), "attempt", attempt, "after", ran.Round(time.Millisecond))
	a.stderr.Write([]byte(formatReport(e, attempt, a.cfg.MaxRestarts, ran, pids, mon)))
}

func formatReport(e *supervisor.WorkerExitError, attempt, maxRestarts int, ran time.Duration, pids map[int]int, mon *hostmon.Monitor) string {
	var b strings.Builder
	fmt.Fprintf(&b, "==== ddp-agent: root cause (attempt %d, restarts used %d of %d) ====\n", attempt, attempt, maxRestarts)
	fmt.Fprintf(&b, "  %v, %s after start\n", e, ran.Round(time.Millisecond))
	if e.ErrorFile != nil {
		fmt.Fprintf(&b, "  error file: %s\n", e.ErrorFile.Message)
		if tb := strings.TrimRight(e.ErrorFile.Traceback, "\n"); tb != "" {
			b.WriteString("  traceback:\n")
			for _, l := range strings.Split(tb, "\n") {
				fmt.Fprintf(&b, "    %s\n", l)
			}
		}
	}
	if len(e.StderrTail) > 0 {
		fmt.Fprintf(&b, "  last %d stderr lines of rank %d:\n", len(e.StderrTail), e.Rank)
		for _, l := range e.StderrTail {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	ranks := make([]int, 0, len(pids))
	for r := range pids {
		ranks = append(ranks, r)
	}
	sort.Ints(ranks)
	b.WriteString("  workers at failure:\n")
	for _, r := range ranks {
		if s, ok := mon.Worker(r); ok {
			fmt.Fprintf(&b, "    %s\n", s)
		} else {
			fmt.Fprintf(&b, "    rank %d pid %d: not sampled yet\n", r, pids[r])
		}
	}
	fmt.Fprintf(&b, "  %s\n", mon.Node())
	return b.String()
}

func signalName(e *supervisor.WorkerExitError) string {
	if e.Signal == 0 {
		return ""
	}
	return e.Signal.String()
}

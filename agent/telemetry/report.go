package telemetry

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"
)

// Report is what a node's agent publishes of the slow collectives it saw,
// for `ddp-agent status` and for the followers that act on the leader's
// stragglers. The agent replaces it as it learns more. Its JSON form is
// stored as it is (the rendezvous keeps it as opaque data, on the agent's
// lease) and shown under "stalls" in `ddp-agent status --json`; its field
// names are stable.
type Report struct {
	Updated time.Time `json:"updated"`
	// Stalls are the last stall reports, one line each, newest last, at
	// most MaxStallLines of at most MaxStallLineBytes, e.g. "step 812
	// bucket 3: rank 5 (node-b, GPU 1, pid 4411) arrived 2.31 s after the
	// others; 7 ranks waited 16.2 GPU-seconds".
	Stalls     []string            `json:"stalls"`
	Stragglers []ReportedStraggler `json:"stragglers"`     // persistent stragglers, at most MaxStragglers
	Hang       string              `json:"hang,omitempty"` // the first line of the last hang report, if any
	// Reformed is the last in-process re-formation of the job's ranks
	// (ddp_agent.InProcess) on this node, one line, if any.
	Reformed string `json:"reformed,omitempty"`
}

// ReportedStraggler is a persistent straggler as a Report carries it: a
// rank that arrived last in most of the recent steps.
type ReportedStraggler struct {
	Rank  int    `json:"rank"`  // global rank
	Host  string `json:"host"`  // where it runs, "" if unknown
	GPU   string `json:"gpu"`   // the UUID of its GPU, "" without one
	Last  int    `json:"last"`  // of the last Steps steps, how many it held the others back in
	Steps int    `json:"steps"` // the steps looked at
	// The wait it caused (median, in its steps) and its share of step time.
	LateMS float64 `json:"late_ms,omitempty"`
	Share  float64 `json:"share,omitempty"`
	// Why: input, compute, gpu, host, network or unknown, and the evidence.
	Cause    string `json:"cause,omitempty"`
	Evidence string `json:"evidence,omitempty"`
}

// Limits of one Report: status reads every node's in one request, so a
// report stays small whatever the workers did.
const (
	MaxStallLines     = 10
	MaxStallLineBytes = 500
	MaxStragglers     = 10
	maxNameBytes      = 256 // a straggler's Host, GPU and Cause
)

// ReportStraggler is st, running on w, as a Report carries it.
func ReportStraggler(st Straggler, w Worker) ReportedStraggler {
	return ReportedStraggler{Rank: st.Rank, Last: st.Last, Steps: st.Steps, Host: w.Host, GPU: w.GPU,
		LateMS: float64(st.Late) / float64(time.Millisecond), Share: st.Share, Cause: string(st.Cause), Evidence: st.Evidence}
}

// Straggler is g as the watch names one: what a Report keeps of it (no
// p-value, noise band or phases).
func (g ReportedStraggler) Straggler() Straggler {
	return Straggler{Rank: g.Rank, Last: g.Last, Steps: g.Steps, Late: time.Duration(g.LateMS * float64(time.Millisecond)),
		Share: g.Share, Cause: Cause(g.Cause), Evidence: g.Evidence}
}

// Named is the stragglers r carries, as the watch names them.
func (r Report) Named() []Straggler {
	out := make([]Straggler, 0, len(r.Stragglers))
	for _, g := range r.Stragglers {
		out = append(out, g.Straggler())
	}
	return out
}

// Encode is r within the limits above, as JSON. It trims a copy of r (the
// oldest stall lines go first; each line, and the hang line, is cut to its
// first line and MaxStallLineBytes) and sets Updated to now when it is
// zero. A straggler with a negative count, more steps last than steps, a
// negative wait or a share outside [0, 1] is an error.
func (r Report) Encode(now time.Time) ([]byte, error) {
	r, err := r.limit(now)
	if err != nil {
		return nil, err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encode stalls report: %w", err)
	}
	return b, nil
}

// DecodeReport parses a Report's JSON form.
func DecodeReport(b []byte) (Report, error) {
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		return Report{}, fmt.Errorf("decode stalls report: %w", err)
	}
	return r, nil
}

// limit returns r within the limits above, sharing no slice with it; now
// stands in for a zero Updated.
func (r Report) limit(now time.Time) (Report, error) {
	out := Report{Updated: r.Updated, Stalls: []string{}, Stragglers: []ReportedStraggler{}, Hang: oneLine(r.Hang, MaxStallLineBytes),
		Reformed: oneLine(r.Reformed, MaxStallLineBytes)}
	if out.Updated.IsZero() {
		out.Updated = now
	}
	for _, l := range r.Stalls {
		if l = oneLine(l, MaxStallLineBytes); l != "" {
			out.Stalls = append(out.Stalls, l)
		}
	}
	if n := len(out.Stalls); n > MaxStallLines {
		out.Stalls = out.Stalls[n-MaxStallLines:] // newest last: keep the tail
	}
	for _, g := range r.Stragglers {
		if g.Rank < 0 || g.Last < 0 || g.Steps < g.Last {
			return Report{}, fmt.Errorf("straggler rank %d: last in %d of %d steps", g.Rank, g.Last, g.Steps)
		}
		if !(g.LateMS >= 0 && g.LateMS < math.MaxInt32) || !(g.Share >= 0 && g.Share <= 1) {
			return Report{}, fmt.Errorf("straggler rank %d: late %v ms, share %v of step time", g.Rank, g.LateMS, g.Share)
		}
		if len(out.Stragglers) == MaxStragglers {
			continue // still check the rest: a bad one is the caller's bug
		}
		g.Host, g.GPU, g.Cause = oneLine(g.Host, maxNameBytes), oneLine(g.GPU, maxNameBytes), oneLine(g.Cause, maxNameBytes)
		g.Evidence = oneLine(g.Evidence, MaxStallLineBytes)
		out.Stragglers = append(out.Stragglers, g)
	}
	return out, nil
}

// oneLine is the first line of s, trimmed, as valid UTF-8 of at most n
// bytes: a longer line is cut at a character boundary and ends in "…".
func oneLine(s string, n int) string {
	s, _, _ = strings.Cut(s, "\n")
	// JSON would turn each invalid byte into a 3-byte U+FFFD: do it before
	// measuring, so the limit holds for what is stored.
	s = strings.TrimSpace(strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	cut := n - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

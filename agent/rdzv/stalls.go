package rdzv

import (
	"context"
	"fmt"
	"math"
	"strings"
	"time"
	"unicode/utf8"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Limits of one node's NodeStalls in the store: status reads every node's
// in one request, so a report stays small whatever the workers did.
const (
	MaxStallLines     = 10
	MaxStallLineBytes = 500
	MaxStragglers     = 10
	maxNameBytes      = 256 // a straggler's Host and GPU
)

// publishTimeout bounds one PublishStalls. A report is worth less than
// the agent's time: a store that does not answer now gets the next one.
const publishTimeout = 3 * time.Second

// PublishStalls puts s at <prefix>stalls/<node> on this node's lease,
// replacing the last report, for `ddp-agent status`. It trims a copy of s
// to the limits above (the oldest stall lines go first; each line, and the
// hang line, is cut to its first line and MaxStallLineBytes) and sets
// Updated when it is zero. A straggler with a negative count, or more
// steps last than steps, is an error and nothing is written.
//
// It blocks for one request to the store, at most publishTimeout and never
// past ctx. It fails after Close and while the lease is lost (a key not
// on the lease would outlive the agent); the lease a later Next registers
// takes the next report. Safe to call concurrently with Next and the
// other methods; of concurrent calls the last to reach the store wins.
func (e *Etcd) PublishStalls(ctx context.Context, s NodeStalls) error {
	if e.bg.Err() != nil {
		return fmt.Errorf("publish stalls of node %s: the rendezvous is closed", e.node)
	}
	s, err := limitStalls(s, time.Now())
	if err != nil {
		return fmt.Errorf("publish stalls of node %s: %w", e.node, err)
	}
	lease, lost := e.leaseChan()
	select {
	case <-lost:
		return fmt.Errorf("publish stalls of node %s: this node's lease on the rendezvous store is lost", e.node)
	default:
	}
	ctx, cancel := context.WithTimeout(ctx, publishTimeout)
	defer cancel()
	if _, err := e.cli.Put(ctx, e.key(stallsDir+e.node), encode(s), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("rendezvous store at %s: publish stalls of node %s: %w", e.cfg.Endpoint, e.node, err)
	}
	return nil
}

// limitStalls returns s within the store's limits, sharing no slice with
// it; now stands in for a zero Updated.
func limitStalls(s NodeStalls, now time.Time) (NodeStalls, error) {
	out := NodeStalls{Updated: s.Updated, Stalls: []string{}, Stragglers: []StragglerInfo{}, Hang: oneLine(s.Hang, MaxStallLineBytes)}
	if out.Updated.IsZero() {
		out.Updated = now
	}
	for _, l := range s.Stalls {
		if l = oneLine(l, MaxStallLineBytes); l != "" {
			out.Stalls = append(out.Stalls, l)
		}
	}
	if n := len(out.Stalls); n > MaxStallLines {
		out.Stalls = out.Stalls[n-MaxStallLines:] // newest last: keep the tail
	}
	for _, g := range s.Stragglers {
		if g.Rank < 0 || g.Last < 0 || g.Steps < g.Last {
			return NodeStalls{}, fmt.Errorf("straggler rank %d: last in %d of %d steps", g.Rank, g.Last, g.Steps)
		}
		if !(g.LateMS >= 0 && g.LateMS < math.MaxInt32) || !(g.Share >= 0 && g.Share <= 1) {
			return NodeStalls{}, fmt.Errorf("straggler rank %d: late %v ms, share %v of step time", g.Rank, g.LateMS, g.Share)
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

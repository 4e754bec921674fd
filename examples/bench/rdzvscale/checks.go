package main

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// waitReformed waits until every agent holds a running round of one
// generation after the fault, an agent's Next fails, or ctx ends.
func waitReformed(ctx context.Context, agents []*agent) error {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		done := true
		gens := map[uint64]bool{}
		var errs []error
		for _, a := range agents {
			r, _, err := a.latest()
			switch {
			case err != nil:
				errs = append(errs, err)
			case r == nil:
				done = false
			default:
				select {
				case <-r.Done():
					done = false
				default:
				}
				gens[r.Generation] = true
			}
		}
		done = done && len(gens) == 1
		if err := firstErrors(errs); err != nil {
			return err
		}
		if done {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			n := 0
			for _, a := range agents {
				if r, _, _ := a.latest(); r != nil {
					n++
				}
			}
			return fmt.Errorf("not re-formed within the timeout (%d of %d agents got a next round): %w", n, len(agents), context.Cause(ctx))
		}
	}
}

// checkOnce checks that the fault re-formed the job once: no agent's first
// round ended before the fault at t0 (a lost lease, most often, which makes
// the re-formation measure something else), and no round after it ended.
func checkOnce(agents []*agent, t0 time.Time) error {
	early := map[string]int{}
	broken := map[string]int{}
	for _, a := range agents {
		a.mu.Lock()
		if !a.ended.IsZero() && a.ended.Before(t0) {
			early[a.r1.Reason()]++
		}
		for _, why := range a.broken {
			broken[why]++
		}
		a.mu.Unlock()
	}
	if len(early) > 0 {
		return fmt.Errorf("the round ended before the injected fault: %s", countedReasons(early))
	}
	if len(broken) > 0 {
		return fmt.Errorf("re-formed more than once: after the injected fault, the new round ended again: %s", countedReasons(broken))
	}
	return nil
}

// countedReasons lists "<count> agents: <why>", sorted, joined by "; ".
func countedReasons(count map[string]int) string {
	var parts []string
	for why, c := range count {
		parts = append(parts, fmt.Sprintf("%d agents: %s", c, why))
	}
	sort.Strings(parts)
	return strings.Join(parts, "; ")
}

// spread returns the time from t0 to the last and to the first of the
// agents' times.
func spread(t0 time.Time, agents []*agent, at func(*agent) time.Time) (last, first time.Duration) {
	first = time.Duration(1<<63 - 1)
	for _, a := range agents {
		d := at(a).Sub(t0)
		last, first = max(last, d), min(first, d)
	}
	return last, first
}

// checkRound checks that every agent got the same generation, that the
// group ranks are 0..n-1 once each, and, with prev, that the generation is
// prev's plus one and every agent kept its group rank.
func checkRound(agents []*agent, n, nproc int, cur, prev func(*agent) *rdzv.Round) error {
	seen := make([]bool, n)
	gen := cur(agents[0]).Generation
	for i, a := range agents {
		r := cur(a)
		switch {
		case r.Generation != gen:
			return fmt.Errorf("agent %d got generation %d, agent 0 got %d", i, r.Generation, gen)
		case r.NNodes != n:
			return fmt.Errorf("agent %d: round of %d nodes, want %d", i, r.NNodes, n)
		case r.RankOffset != r.GroupRank*nproc:
			return fmt.Errorf("agent %d: rank offset %d for group rank %d", i, r.RankOffset, r.GroupRank)
		case r.WorldSize != n*nproc:
			return fmt.Errorf("agent %d: world size %d, want %d", i, r.WorldSize, n*nproc)
		case r.GroupRank < 0 || r.GroupRank >= n || seen[r.GroupRank]:
			return fmt.Errorf("agent %d: group rank %d out of range or taken twice", i, r.GroupRank)
		}
		seen[r.GroupRank] = true
		if prev != nil {
			p := prev(a)
			if r.Generation != p.Generation+1 {
				return fmt.Errorf("agent %d: generation %d after %d", i, r.Generation, p.Generation)
			}
			if r.Restarts != p.Restarts+1 {
				return fmt.Errorf("agent %d: restarts went from %d to %d: another fault than the injected one counted", i, p.Restarts, r.Restarts)
			}
			if r.GroupRank != p.GroupRank {
				return fmt.Errorf("agent %d: group rank %d, was %d (ranks should be stable)", i, r.GroupRank, p.GroupRank)
			}
		}
	}
	return nil
}

// stateSize is the size of the state value: what every watcher of the
// state key and every reader of it gets, each time it changes.
// It reads even when ctx has ended: the run's figures are still reported.
func stateSize(ctx context.Context, cli *etcdClient, prefix string) int {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	v, err := store.NewKV(cli, prefix).Get(ctx, "state")
	if err != nil {
		return 0
	}
	return len(v)
}

// firstErrors joins the distinct errors of errs, with counts.
func firstErrors(errs []error) error {
	count := map[string]int{}
	var order []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		s := err.Error()
		if count[s] == 0 {
			order = append(order, s)
		}
		count[s]++
	}
	if len(order) == 0 {
		return nil
	}
	var parts []string
	for i, s := range order {
		if i == 5 {
			parts = append(parts, fmt.Sprintf("and %d other errors", len(order)-5))
			break
		}
		parts = append(parts, fmt.Sprintf("%d agents: %s", count[s], s))
	}
	return errors.New(strings.Join(parts, "; "))
}

// sleepCtx sleeps for d; false if ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitBounded waits for wg, at most d; false if d passed first.
func waitBounded(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

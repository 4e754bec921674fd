package straggler

import (
	"context"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Across nodes only the leader (group rank 0's agent) names persistent
// stragglers: it alone sees every rank. A drain, though, is the straggler's
// own node's to do. The leader publishes the stragglers it names in the
// store (for `ddp-agent status`), so a follower under --straggler-action
// drain reads them there every followEvery and confirms those of its own
// ranks with its own clock, as if its watch had named them.
const followEvery = 2 * time.Second

// follow starts reading the leader's stragglers for the attempt at, until
// the attempt ends; only a follower under drain does.
func (p *Policy) follow(at Attempt) {
	if p.action != ActionDrain || !at.Follower || p.readNamed == nil {
		return
	}
	ctx, cancel := context.WithCancel(p.runCtx)
	p.mu.Lock()
	p.stopFollow = cancel
	p.mu.Unlock()
	p.background(func() {
		defer cancel()
		t := time.NewTicker(followEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			rctx, rcancel := context.WithTimeout(ctx, followEvery)
			named, err := p.readNamed(rctx)
			rcancel()
			if err != nil {
				p.log.Debug("read the leader's persistent stragglers", "err", err)
				continue
			}
			p.lookAt(at.Gen, localStragglers(named, at), false)
		}
	})
}

// localStragglers are those of named that run on the node of at.
func localStragglers(named []telemetry.Straggler, at Attempt) []telemetry.Straggler {
	var out []telemetry.Straggler
	for _, st := range named {
		if at.local(st.Rank) {
			out = append(out, st)
		}
	}
	return out
}

// publishedStragglers reads the persistent stragglers every agent of the
// job published, as `ddp-agent status` shows them, from the job's status
// (a follower's look every few seconds under --straggler-action drain).
func publishedStragglers(status func(context.Context) (*rdzv.Status, error)) func(context.Context) ([]telemetry.Straggler, error) {
	return func(ctx context.Context) ([]telemetry.Straggler, error) {
		st, err := status(ctx)
		if err != nil {
			return nil, fmt.Errorf("published stragglers: %w", err)
		}
		var out []telemetry.Straggler
		for _, ns := range st.Nodes {
			if ns.Stalls == nil {
				continue
			}
			r, err := telemetry.DecodeReport(ns.Stalls)
			if err != nil { // written by hand, or by another version: status shows it
				continue
			}
			out = append(out, r.Named()...)
		}
		return out, nil
	}
}

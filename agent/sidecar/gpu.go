package sidecar

import (
	"context"
	"fmt"

	"github.com/ddp-agent/ddp-agent/agent/observe"

	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// watchGPUs runs the node's GPU health watch until ctx is done. A finding
// that calls for a restart aborts the jobs whose workers use the GPU (all
// of them when the workers did not say theirs); one that calls for a
// reset or a drain aborts every job here and says the node needs it: the
// sidecar cannot take the node out of the scheduler itself.
func (sc *Sidecar) watchGPUs(ctx context.Context) {
	g := sc.cfg.GPUs
	if g == nil || g.Topology == nil {
		return
	}
	devs := make([]health.Device, 0, len(g.Topology.GPUs))
	for i, d := range g.Topology.GPUs {
		devs = append(devs, health.Device{Index: i, UUID: d.UUID})
	}
	opts := []health.Option{health.WithLogger(sc.log.With("subsystem", "gpu-health"))}
	observe.WatchGPUs(ctx, g.Watch, devs, opts, func(findings []health.Finding) bool {
		for _, f := range findings {
			reason := fmt.Sprintf("GPU %d (%s): %s", f.GPU, f.UUID, f.Message)
			sc.notify(notifier.Event{Kind: notifier.GPUFault, Rank: -1, Message: reason, Details: map[string]string{"action": f.Action.String()}})
			if f.Action >= health.ActionResetGPU {
				sc.log.Error("GPU fault: this node must be drained or its GPU reset; aborting every job's communicators here", "action", f.Action.String(), "finding", reason)
				sc.abortAll(reason + ": " + f.Action.String())
				continue
			}
			sc.abortUsers(f.UUID, reason+": restarting the workers")
		}
		return true
	})
}

// abortUsers aborts the jobs with a worker on GPU uuid. A worker that did
// not say its GPU (a CPU job's, or torch 1.13's, which has no UUIDs) is
// not taken for one on it: a restart-level finding concerns the processes
// on that GPU only (a drain-level one aborts every job anyway).
func (sc *Sidecar) abortUsers(uuid, reason string) {
	sc.mu.Lock()
	var hit []string
	for id, j := range sc.jobs {
		j.mu.Lock()
		for _, p := range j.peers {
			if p.gpu == uuid {
				hit = append(hit, id)
				break
			}
		}
		j.mu.Unlock()
	}
	sc.mu.Unlock()
	if len(hit) == 0 {
		sc.log.Warn("GPU fault on a GPU without workers of any job: nothing to abort", "uuid", uuid, "finding", reason)
	}
	for _, id := range hit {
		sc.abortJob(id, -1, reason)
	}
}

package agent

import (
	"context"
	"slices"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/placement"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
)

// GPUs is what the agent uses of this node's GPUs (Config.GPUs). An agent
// without them (nil) runs a CPU-only node: no placement, no binding, no
// health watch.
type GPUs struct {
	Topology *nvml.Topology
	Plan     *placement.Plan
	Binding  placement.Mode
	// Bind is the executable whose "__bind" command binds a worker and
	// execs it (ddp-agent itself).
	Bind string
	// Virtual: each worker sees its own GPU alone (--virtual-local-rank).
	Virtual bool
	// Watch, when set, makes the health watcher of the GPUs over the
	// node's NVML (which the caller shuts down after Run). Nil with a saved
	// topology (DDP_AGENT_TOPOLOGY): nothing to watch.
	Watch func(devs []health.Device, opts ...health.Option) *health.Watcher
	// State, when set, reads a GPU's state now (temperature, clocks,
	// throttling), for the report of a persistent straggler.
	State func(uuid string) (nvml.GPUState, error)
}

// placer is the supervisor's Spec.Place: nil on a CPU-only node.
func (g *GPUs) placer() func(int) supervisor.Placement {
	if g == nil || g.Plan == nil {
		return nil
	}
	return g.place
}

// place is the supervisor's Spec.Place for the agent's plan.
func (g *GPUs) place(lr int) supervisor.Placement {
	if g == nil || g.Plan == nil || lr >= len(g.Plan.Workers) {
		return supervisor.Placement{}
	}
	var p supervisor.Placement
	if args := g.Plan.Workers[lr].Args(); len(args) > 0 {
		p.Prefix = append([]string{g.Bind}, args...)
	}
	p.Env = g.Plan.Env(lr)
	if g.Virtual {
		p.Env = g.Plan.VirtualEnv(lr)
	}
	return p
}

// node is what the node entry in the rendezvous store says of the GPUs.
func (g *GPUs) node() *rdzv.NodeGPUs {
	if g == nil || g.Topology == nil || g.Plan == nil {
		return nil
	}
	n := &rdzv.NodeGPUs{Summary: g.Topology.Summary(), Binding: string(g.Binding), Ring: slices.Clone(g.Plan.Ring)}
	for _, w := range g.Plan.Workers {
		n.Workers = append(n.Workers, rdzv.WorkerGPU{LocalRank: w.LocalRank, GPU: w.GPU, UUID: w.UUID, CPUs: w.CPUs.String(), MemNode: w.MemNode})
	}
	return n
}

// ranksOn names the global ranks of the current attempt's workers on GPU
// gpu (an NVML index); nil between attempts (once the last attempt's
// workers are stopped, until the next one starts). The health watcher calls it
// from its own goroutines.
func (r *run) ranksOn(gpu int) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	g := r.cfg.GPUs
	if r.group == nil || g == nil || g.Plan == nil {
		return nil
	}
	var ranks []int
	for _, w := range g.Plan.Workers {
		if w.GPU == gpu {
			ranks = append(ranks, r.rankOffset+w.LocalRank)
		}
	}
	return ranks
}

// watchGPUs runs the health watch of the plan's GPUs until ctx is done
// (observe.WatchGPUs). Findings that call for a restart of the workers
// using a GPU, a reset or a drain are reported as one fault, with its
// severity; after a drain it stops. It returns at once without NVML.
func (r *run) watchGPUs(ctx context.Context, report func(*fault.Fault)) {
	g := r.cfg.GPUs
	if g == nil || g.Watch == nil || g.Plan == nil {
		return
	}
	devs := make([]health.Device, 0, len(g.Plan.Ring))
	for _, i := range g.Plan.Ring {
		devs = append(devs, health.Device{Index: i, UUID: g.Topology.GPUs[i].UUID})
	}
	opts := []health.Option{health.WithLogger(r.log.With("subsystem", "gpu-health")), health.WithRanks(r.ranksOn)}
	observe.WatchGPUs(ctx, g.Watch, devs, opts, func(findings []health.Finding) bool {
		var serious []health.Finding
		for _, f := range findings {
			switch {
			case f.Action >= health.ActionResetGPU:
				serious = append(serious, f) // the node is unhealthy, whoever uses the GPU
			case len(f.Ranks) > 0:
				serious = append(serious, f)
			default:
				// An application fault of another process, or of workers
				// already gone: nothing of this job to restart.
				r.log.Warn("GPU fault on a GPU without workers of this job: nothing to restart",
					"gpu", f.GPU, "uuid", f.UUID, "finding", f.Message)
			}
		}
		if len(serious) == 0 {
			return true
		}
		action := health.Decide(serious)
		slices.SortStableFunc(serious, func(x, y health.Finding) int { return int(y.Action) - int(x.Action) })
		gf := &fault.GPUError{Action: action, Findings: serious}
		if gf.Drains() {
			r.log.Error("GPU fault: this node leaves the job", "action", action.String(), "gpu", serious[0].GPU,
				"uuid", serious[0].UUID, "ranks", serious[0].Ranks, "finding", serious[0].Message)
		}
		report(fault.GPU(gf))
		return !gf.Drains()
	})
}

// state reads a GPU's state now; nil without NVML.
func (g *GPUs) state() func(string) (nvml.GPUState, error) {
	if g == nil {
		return nil
	}
	return g.State
}

// topology is the GPUs in one line for the exporter; "" on a CPU-only
// node.
func (g *GPUs) topology() string {
	if g == nil || g.Topology == nil {
		return ""
	}
	return g.Topology.Summary()
}

// summary is the GPUs and the placement in one line for the log.
func (g *GPUs) summary() string {
	if g == nil || g.Topology == nil {
		return "none (CPU-only node)"
	}
	s := g.Topology.Summary()
	if g.Plan != nil {
		s += "; " + g.Plan.String()
	}
	return s
}

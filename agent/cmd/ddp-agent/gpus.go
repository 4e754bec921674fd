package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/ddp-agent/ddp-agent/agent"
	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/placement"
	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
)

// bindCommand is the hidden command the agent starts bound workers
// through: ddp-agent __bind --cpus LIST [--mem NODE [--strict]] -- argv...
const bindCommand = placement.BindCommand

// topologyEnv names a saved `ddp-agent topo --json` output that ddp-agent
// run uses instead of NVML: to see what placement a GPU node would get,
// from any machine, and for tests. There is nothing to watch then.
const topologyEnv = envname.Topology

// gpuNode is this node's GPUs as discovered before the command line is
// parsed (--nproc-per-node gpu needs them).
type gpuNode struct {
	getenv func(string) string
	topo   *nvml.Topology // nil: no GPUs
	lib    *nvml.Lib      // the NVML the topology came from; nil with a saved one
	none   string         // why there are no GPUs, for the one log line
	warn   bool           // none is a problem (NVML there but failing), not just a CPU-only node
	err    error          // the saved topology cannot be used: a usage error
}

func discoverGPUs(ctx context.Context, getenv func(string) string) *gpuNode {
	n := &gpuNode{getenv: getenv}
	if path := getenv(topologyEnv); path != "" {
		t, err := loadTopology(path)
		switch {
		case err != nil:
			n.err = fmt.Errorf("%s: %w", topologyEnv, err)
		case len(t.GPUs) == 0:
			n.none = fmt.Sprintf("the saved topology %s (%s) has no GPUs", path, topologyEnv)
		default:
			n.topo = t
		}
		return n
	}
	lib, opts, err := openNVML(getenv)
	if err != nil {
		var noDriver *nvml.NoDriverError
		if errors.As(err, &noDriver) {
			n.none = noDriver.Reason
		} else {
			n.none, n.warn = err.Error(), true
		}
		return n
	}
	t, err := nvml.Discover(ctx, lib, opts...)
	switch {
	case err != nil:
		n.none, n.warn = "NVML cannot list the GPUs: "+err.Error(), true
	case len(t.GPUs) == 0:
		n.none = "the NVIDIA driver " + t.Driver + " reports no GPUs"
	default:
		n.topo, n.lib = t, lib
		return n
	}
	lib.Shutdown()
	return n
}

// loadTopology reads a `ddp-agent topo --json` output.
func loadTopology(path string) (*nvml.Topology, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var t nvml.Topology
	if err := json.Unmarshal(b, &t); err != nil {
		return nil, fmt.Errorf("%s is not the output of ddp-agent topo --json: %w", path, err)
	}
	for i, g := range t.GPUs {
		if g.Index != i {
			return nil, fmt.Errorf("%s: GPU %d is listed at position %d; the GPUs must be in NVML index order", path, g.Index, i)
		}
	}
	if len(t.Links) != len(t.GPUs) {
		return nil, fmt.Errorf("%s: %d rows of links for %d GPUs", path, len(t.Links), len(t.GPUs))
	}
	for i, row := range t.Links {
		if len(row) != len(t.GPUs) {
			return nil, fmt.Errorf("%s: links row %d has %d entries for %d GPUs", path, i, len(row), len(t.GPUs))
		}
	}
	return &t, nil
}

func (n *gpuNode) close() {
	if n.lib != nil {
		n.lib.Shutdown()
	}
}

// visibleGPUs counts the GPUs the workers may use, for --nproc-per-node
// gpu and auto.
func (n *gpuNode) visibleGPUs() (int, error) {
	if n.topo == nil {
		return 0, errors.New(n.none)
	}
	v, set := n.visible()
	if set && strings.Contains(v, "MIG-") {
		// MIG instances are not in the topology: count them as CUDA does.
		return placement.VisibleCount(v), nil
	}
	p, err := placement.New(placement.Input{Topology: n.topo, NProc: 1, Mode: placement.ModeNone, Visible: v, VisibleSet: set})
	if err != nil {
		return 0, err
	}
	return len(p.Ring), nil
}

// visible is the agent's CUDA_VISIBLE_DEVICES and whether it is set (an
// empty value hides every GPU).
func (n *gpuNode) visible() (string, bool) {
	v := n.getenv("CUDA_VISIBLE_DEVICES")
	if v != "" {
		return v, true
	}
	_, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	return "", set
}

// place plans where the workers run, and says in one line when the node
// has no GPUs. A nil *agent.GPUs is a CPU-only node.
func (n *gpuNode) place(cfg *launch.Config, log *slog.Logger) (*agent.GPUs, error) {
	mode := placement.Mode(cfg.NUMABinding)
	if n.topo == nil {
		msg := "no NVIDIA GPU (" + n.none + "): CPU-only node, no GPU placement, NUMA binding or GPU health watch"
		if n.warn {
			log.Warn(msg)
		} else {
			log.Info(msg)
		}
		if mode != "" && mode != placement.ModeNone {
			log.Warn("--numa-binding " + string(mode) + " binds workers near their GPUs; without GPUs the workers are not bound")
		}
		return nil, nil
	}
	if mode == "" {
		mode = placement.ModeNode
	}
	allowed, err := placement.Affinity()
	if err != nil {
		log.Debug("read the agent's CPU affinity; binding without it", "err", err)
		allowed = nil
	}
	mems, err := placement.MemsAllowed()
	if err != nil {
		log.Debug("read the agent's memory nodes; binding without them", "err", err)
		mems = nil
	}
	v, set := n.visible()
	plan, err := placement.New(placement.Input{Topology: n.topo, NProc: cfg.NProcPerNode, Mode: mode,
		Visible: v, VisibleSet: set, Allowed: allowed, AllowedMems: mems, SysFS: os.DirFS("/sys")})
	if err != nil {
		return nil, fmt.Errorf("placement: %w", err)
	}
	for _, note := range plan.Notes {
		log.Warn("placement: " + note)
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the ddp-agent executable for NUMA binding: %w", err)
	}
	g := &agent.GPUs{Topology: n.topo, Plan: plan, Binding: mode, Bind: exe, Virtual: cfg.VirtualLocalRank}
	if lib := n.lib; lib != nil {
		g.Watch = func(devs []health.Device, opts ...health.Option) *health.Watcher {
			return health.NewWatcher(lib, devs, opts...)
		}
		g.State = func(uuid string) (nvml.GPUState, error) { return nvml.ReadGPUState(lib, uuid) }
	}
	return g, nil
}

package launch

import (
	"errors"
	"strconv"
)

// The default bound on --nproc-per-node. torchrun has none, and a typo
// (--nproc-per-node 100000) forks workers until the node runs out of file
// descriptors or pids, ignoring signals while it does. Nobody runs more
// than one worker per GPU, or per CPU for a CPU job; 4 times that leaves
// room for oversubscribed tests and debugging, and the floor lets a small
// CI runner (2 CPUs) still run a 32-rank world. Past that, the user says
// so with --max-nproc-per-node.
const (
	nprocPerDevice = 4
	nprocFloor     = 32
)

// DefaultNProcLimit is the most workers a node with cpus CPUs and gpus
// GPUs runs without --max-nproc-per-node.
func DefaultNProcLimit(cpus, gpus int) int {
	return max(nprocPerDevice*max(cpus, gpus), nprocFloor)
}

// nproc reads --nproc-per-node, resolves auto, cpu and gpu, and checks the
// result against --max-nproc-per-node or the default bound.
func (r rawFlags) nproc(c *Config, host Host) error {
	c.NProcSpec = r["nproc-per-node"]
	var err error
	if c.NProcPerNode, err = resolveNProc(c.NProcSpec, host); err != nil {
		return err
	}
	if v := r["max-nproc-per-node"]; v != "" {
		if c.NProcLimit, err = r.int("max-nproc-per-node", 1); err != nil {
			return err
		}
		if c.NProcPerNode > c.NProcLimit {
			return usagef("--nproc-per-node %s (%d workers) is above --max-nproc-per-node %d", c.NProcSpec, c.NProcPerNode, c.NProcLimit)
		}
		return nil
	}
	gpus := 0
	if c.NProcPerNode > DefaultNProcLimit(host.CPUs, 0) && host.GPUs != nil {
		// Only a count above the CPUs' bound needs the GPUs counted.
		if n, err := host.GPUs(); err == nil {
			gpus = n
		}
	}
	c.NProcLimit = DefaultNProcLimit(host.CPUs, gpus)
	if c.NProcPerNode > c.NProcLimit {
		return usagef("--nproc-per-node %s (%d workers) is above this node's limit of %d (%d per CPU or GPU: %d CPUs, %d GPUs; at least %d); "+
			"if you mean it, raise the limit with --max-nproc-per-node %d",
			c.NProcSpec, c.NProcPerNode, c.NProcLimit, nprocPerDevice, host.CPUs, gpus, nprocFloor, c.NProcPerNode)
	}
	return nil
}

func resolveNProc(v string, host Host) (int, error) {
	gpus := func() (int, error) {
		if host.GPUs == nil {
			return 0, errors.New("no GPU discovery")
		}
		return host.GPUs()
	}
	switch v {
	case "cpu":
		return max(host.CPUs, 1), nil
	case "gpu":
		n, err := gpus()
		if err != nil || n == 0 {
			return 0, usagef("--nproc-per-node gpu: no GPU found (%v); use a number or cpu", errOrNone(err))
		}
		return n, nil
	case "auto":
		if n, err := gpus(); err == nil && n > 0 {
			return n, nil
		}
		return max(host.CPUs, 1), nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		return 0, usagef("--nproc-per-node must be a positive integer, auto, cpu or gpu, got %q", v)
	}
	return n, nil
}

func errOrNone(err error) error {
	if err == nil {
		return errors.New("0 GPUs visible")
	}
	return err
}

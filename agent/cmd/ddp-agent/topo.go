package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/ddp-agent/ddp-agent/nvml"
)

const topoUsage = `Usage: ddp-agent topo [--json]

Shows this node's GPUs and how they are linked, as nvidia-smi topo -m does:
a GPU x GPU matrix (X, NV#, PIX, PXB, PHB, NODE, SYS) with each GPU's CPU
and NUMA affinity, then each GPU (UUID, PCI bus id, memory, compute
capability, MIG mode) and the node's CPU and NUMA layout. It reads NVML
(libnvidia-ml.so.1) and sysfs, and changes nothing.

On a node without an NVIDIA driver or GPUs it says so in one line and shows
the CPU and NUMA layout.

Flags:
  --json   print one JSON object: driver_version, cuda_driver_version, gpus,
           links (a GPU x GPU matrix), nvswitch, host, notes; on a node
           without GPUs "gpus" is [] and "no_gpu" says why

Exit codes: 0 the topology (or the CPU-only layout) was shown; 1 NVML is
there but cannot list the GPUs; 2 usage error.
`

// topoSources is where ddp-agent topo reads the node; tests replace it.
type topoSources struct {
	// gpus loads NVML and discovers the GPUs (nvml.Load); an error that
	// matches nvml.ErrNoDriver means a CPU-only node.
	gpus func(context.Context) (*nvml.Topology, error)
	// host reads the CPU/NUMA layout (nvml.DiscoverHost) when there are no
	// GPUs to read it with.
	host func(context.Context) (nvml.HostInfo, error)
}

var realTopoSources = topoSources{
	gpus: func(ctx context.Context) (*nvml.Topology, error) { return nvml.Load(ctx) },
	host: func(ctx context.Context) (nvml.HostInfo, error) { return nvml.DiscoverHost(ctx) },
}

// topoJSON is the --json form: nvml.Topology (documented there) and, on a
// node without GPUs, why.
type topoJSON struct {
	*nvml.Topology
	NoGPU string `json:"no_gpu,omitempty"`
}

func runTopo(args []string, stdout, stderr io.Writer) int {
	return runTopoWith(context.Background(), args, stdout, stderr, realTopoSources)
}

func runTopoWith(ctx context.Context, args []string, stdout, stderr io.Writer, src topoSources) int {
	asJSON := false
	for _, a := range args {
		switch a {
		case "-h", "--help":
			fmt.Fprint(stdout, topoUsage)
			return 0
		case "--json":
			asJSON = true
		default:
			fmt.Fprintf(stderr, "ddp-agent topo: unexpected argument %q (see ddp-agent help topo)\n", a)
			return 2
		}
	}

	topo, err := src.gpus(ctx)
	noGPU := ""
	var noDriver *nvml.NoDriverError
	switch {
	case errors.As(err, &noDriver):
		noGPU = noDriver.Reason
	case errors.Is(err, nvml.ErrNoDriver):
		noGPU = err.Error()
	case err != nil:
		fmt.Fprintf(stderr, "ddp-agent topo: %v\n", err)
		return 1
	case len(topo.GPUs) == 0:
		noGPU = "the NVIDIA driver " + topo.Driver + " reports no GPUs"
	}
	if topo == nil {
		h, herr := src.host(ctx)
		topo = &nvml.Topology{GPUs: []nvml.GPU{}, Links: [][]nvml.Link{}, Host: h}
		if herr != nil {
			topo.Notes = append(topo.Notes, "host: "+herr.Error())
		}
	}

	if asJSON {
		if err := json.NewEncoder(stdout).Encode(topoJSON{Topology: topo, NoGPU: noGPU}); err != nil {
			fmt.Fprintf(stderr, "ddp-agent topo: %v\n", err)
			return 1
		}
		return 0
	}
	if noGPU != "" {
		fmt.Fprintf(stdout, "no NVIDIA GPU: %s; CPU-only node\n", noGPU)
	} else {
		nvml.WriteMatrix(stdout, topo)
		fmt.Fprintln(stdout)
		nvml.WriteGPUs(stdout, topo)
		fmt.Fprintln(stdout)
	}
	nvml.WriteHost(stdout, topo.Host)
	for _, n := range topo.Notes {
		fmt.Fprintf(stdout, "NOTE: %s\n", n)
	}
	return 0
}

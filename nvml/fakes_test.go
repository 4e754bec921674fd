package nvml

import (
	"context"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// The machines the tests drive are nvmltest's (a DGX A100, a PCIe box);
// this file is the glue that turns them into Options.

// listToMask is maskToList's inverse: the bitmask words NVML fills.
func listToMask(l CPUList) []uint { return nvmltest.Mask(l) }

func mustList(s string) CPUList {
	l, err := ParseCPUList(s)
	if err != nil {
		panic(err)
	}
	return l
}

var busID = nvmltest.BusID

// withCPUFacts replaces gopsutil with fixed answers.
func withCPUFacts(f cpuFacts, err error) Option {
	return func(o *topoOptions) {
		o.cpuFacts = func(context.Context) (cpuFacts, error) { return f, err }
	}
}

// withCPU answers gopsutil's questions with what nvmltest says about a
// machine's CPUs.
func withCPU(c nvmltest.CPUInfo) Option {
	return withCPUFacts(cpuFacts{model: c.Model, sockets: c.Sockets, cores: c.Cores, cpus: c.CPUs}, nil)
}

// The DGX A100: see nvmltest.DGXA100.
var (
	dgxNUMA     = nvmltest.DGXNUMA()
	dgxNodeCPUs = nvmltest.DGXNodeCPUs
)

func dgxServer(remoteType bool) *dgxa100.Server { return nvmltest.DGXA100(remoteType) }

func dgxOptions() []Option {
	return []Option{WithSysFS(nvmltest.DGXSysFS()), withCPU(nvmltest.DGXCPU())}
}

// pcieBox is nvmltest.PCIeBox with its Options.
type pcieBox struct{ *nvmltest.PCIeBox }

func newPCIeBox() pcieBox { return pcieBox{nvmltest.NewPCIeBox()} }

func (b pcieBox) options() []Option {
	return []Option{WithSysFS(b.SysFS()), withCPU(b.CPU())}
}

package nvml

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
)

// matrixLegend is nvidia-smi topo -m's legend, word for word.
const matrixLegend = `
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
`

// WriteMatrix writes t's GPU matrix as nvidia-smi topo -m (driver R535 and
// later) does, byte for byte where the data allow: tab-separated columns,
// a header row that starts with a tab, " X " on the diagonal, then the
// "CPU Affinity", "NUMA Affinity" and "GPU NUMA ID" columns (N/A when
// unknown) and the legend. Unlike nvidia-smi it lists GPUs only (no NICs)
// and never underlines the header with terminal escapes.
func WriteMatrix(w io.Writer, t *Topology) error {
	bw := bufio.NewWriter(w)
	for _, g := range t.GPUs {
		fmt.Fprintf(bw, "\tGPU%d", g.Index)
	}
	bw.WriteString("\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n")
	for i, g := range t.GPUs {
		fmt.Fprintf(bw, "GPU%d", g.Index)
		for j := range t.GPUs {
			c := "N/A"
			if i < len(t.Links) && j < len(t.Links[i]) {
				c = t.Links[i][j].Class()
			}
			if c == string(PathSelf) {
				c = " X "
			}
			bw.WriteString("\t" + c)
		}
		fmt.Fprintf(bw, "\t%s\t%s\t\t%s\n", orNA(g.CPUAffinity.String()), nodeOrNA(g.NUMANode), nodeOrNA(g.GPUNUMANode))
	}
	bw.WriteString(matrixLegend)
	return bw.Flush()
}

// WriteGPUs writes one line per GPU, as nvidia-smi -L does with the
// details topology users look for, under a line with the driver's
// versions.
func WriteGPUs(w io.Writer, t *Topology) error {
	bw := bufio.NewWriter(w)
	nvswitch := "no"
	if t.NVSwitch {
		nvswitch = "yes"
	}
	fmt.Fprintf(bw, "Driver Version: %s   CUDA Version: %s   NVSwitch: %s\n", orNA(t.Driver), orNA(t.CUDA), nvswitch)
	for _, g := range t.GPUs {
		if g.Error != "" {
			fmt.Fprintf(bw, "GPU %d: %s\n", g.Index, g.Error)
			continue
		}
		mig := "MIG " + g.MIG
		if g.MIGPending != "" {
			mig += " (" + g.MIGPending + " after reset)"
		}
		fmt.Fprintf(bw, "GPU %d: %s (UUID: %s)  bus %s  %d MiB  compute %s  %s  NVLinks %d\n",
			g.Index, orNA(g.Name), orNA(g.UUID), orNA(g.BusID), g.MemoryTotal>>20, orNA(g.ComputeCapability), mig, g.NVLinks)
	}
	return bw.Flush()
}

// WriteHost writes the CPU and NUMA layout as lscpu's summary does.
func WriteHost(w io.Writer, h HostInfo) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	count := func(n int) string {
		if n <= 0 {
			return "N/A"
		}
		return strconv.Itoa(n)
	}
	fmt.Fprintf(tw, "CPU(s):\t%s\n", count(h.CPUs))
	fmt.Fprintf(tw, "On-line CPU(s) list:\t%s\n", orNA(h.OnlineCPUs.String()))
	if h.CPUModel != "" {
		fmt.Fprintf(tw, "Model name:\t%s\n", h.CPUModel)
	}
	fmt.Fprintf(tw, "Socket(s):\t%s\n", count(h.Sockets))
	if h.Sockets > 0 && h.Cores > 0 {
		fmt.Fprintf(tw, "Core(s) per socket:\t%d\n", h.Cores/h.Sockets)
	}
	if h.Cores > 0 && h.CPUs > 0 {
		fmt.Fprintf(tw, "Thread(s) per core:\t%d\n", h.CPUs/h.Cores)
	}
	if len(h.NUMANodes) == 0 {
		fmt.Fprintf(tw, "NUMA node(s):\tnone reported by the kernel\n")
	} else {
		fmt.Fprintf(tw, "NUMA node(s):\t%d\n", len(h.NUMANodes))
	}
	for _, n := range h.NUMANodes {
		mem := ""
		if n.MemoryTotal > 0 {
			mem = fmt.Sprintf("  (%s memory)", gib(n.MemoryTotal))
		}
		fmt.Fprintf(tw, "NUMA node%d CPU(s):\t%s%s\n", n.ID, orNA(n.CPUs.String()), mem)
	}
	return tw.Flush()
}

func gib(b uint64) string {
	s := strconv.FormatFloat(float64(b)/(1<<30), 'f', 1, 64)
	return strings.TrimSuffix(s, ".0") + " GiB"
}

func orNA(s string) string {
	if s == "" {
		return "N/A"
	}
	return s
}

func nodeOrNA(n int) string {
	if n < 0 {
		return "N/A"
	}
	return strconv.Itoa(n)
}

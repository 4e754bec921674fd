// Package nvmltest gives go-nvml mocks of real machines for tests: a DGX
// A100 (go-nvml's mock/dgxa100 with the topology calls that mock leaves
// out), a four-GPU PCIe-only two-socket server built from mock.Interface,
// the /sys trees that go with them, an NVML event set that a test feeds
// one event at a time, and GPU telemetry (temperature, clocks, power,
// utilization, clock event reasons, processes) that a test turns. The tests of package nvml and of the packages
// that use it (the agent) drive the same machines through it.
//
// It does not import package nvml, whose own tests import it: CPU lists
// are []int, a /sys tree is an fstest.MapFS (pass it to nvml.WithSysFS),
// and what gopsutil would say about the CPUs is a CPUInfo.
package nvmltest

import (
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"testing/fstest"
)

// CPUInfo is what gopsutil says about a machine's CPUs.
type CPUInfo struct {
	Model   string
	Sockets int
	Cores   int // physical
	CPUs    int // logical
}

// SysFS builds a /sys with the given online CPUs (a kernel cpulist,
// "0-63"), NUMA nodes (id → cpulist; each node has 125 GiB in its meminfo)
// and PCI devices' numa_node (kernel bus id, "0000:1b:00.0" → node).
func SysFS(online string, nodes map[int]string, pciNodes map[string]int) fstest.MapFS {
	fsys := fstest.MapFS{
		"devices/system/cpu/online": {Data: []byte(online + "\n")},
	}
	for id, cpus := range nodes {
		dir := fmt.Sprintf("devices/system/node/node%d/", id)
		fsys[dir+"cpulist"] = &fstest.MapFile{Data: []byte(cpus + "\n")}
		fsys[dir+"meminfo"] = &fstest.MapFile{Data: []byte(fmt.Sprintf(
			"Node %d MemTotal:       131072000 kB\nNode %d MemFree:        1000 kB\n", id, id))}
	}
	fsys["devices/system/node/possible"] = &fstest.MapFile{Data: []byte("0-7\n")}
	for bus, node := range pciNodes {
		fsys["bus/pci/devices/"+bus+"/numa_node"] = &fstest.MapFile{Data: []byte(fmt.Sprintf("%d\n", node))}
	}
	return fsys
}

// Mask is the bitmask words NVML fills for a set of CPU (or NUMA node)
// ids, as nvmlDeviceGetCpuAffinity and nvmlDeviceGetMemoryAffinity do.
func Mask(cpus []int) []uint {
	var words []uint
	for _, c := range cpus {
		w := c / bits.UintSize
		for len(words) <= w {
			words = append(words, 0)
		}
		words[w] |= 1 << (c % bits.UintSize)
	}
	return words
}

// BusID is s as the NUL-padded BusId of nvmlPciInfo_t.
func BusID(s string) [32]uint8 {
	var b [32]uint8
	copy(b[:], s)
	return b
}

// cpus parses a kernel cpulist ("0-15,32-47"); the lists here are
// constants, so a bad one panics.
func cpus(s string) []int {
	var l []int
	for part := range strings.SplitSeq(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			panic(fmt.Sprintf("nvmltest: cpulist %q: %v", s, err))
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil {
				panic(fmt.Sprintf("nvmltest: cpulist %q: %v", s, err))
			}
		}
		for c := a; c <= b; c++ {
			l = append(l, c)
		}
	}
	return l
}

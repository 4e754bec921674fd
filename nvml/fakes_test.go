package nvml

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"testing/fstest"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// listToMask is maskToList's inverse: the bitmask words NVML fills.
func listToMask(l CPUList) []uint {
	var words []uint
	for _, c := range l {
		w := c / bits.UintSize
		for len(words) <= w {
			words = append(words, 0)
		}
		words[w] |= 1 << (c % bits.UintSize)
	}
	return words
}

func mustList(s string) CPUList {
	l, err := ParseCPUList(s)
	if err != nil {
		panic(err)
	}
	return l
}

func busID(s string) [32]uint8 {
	var b [32]uint8
	copy(b[:], s)
	return b
}

// withCPUFacts replaces gopsutil with fixed answers.
func withCPUFacts(f cpuFacts, err error) Option {
	return func(o *topoOptions) {
		o.cpuFacts = func(context.Context) (cpuFacts, error) { return f, err }
	}
}

// sysfsTree builds a /sys with the given online CPUs, NUMA nodes (id →
// cpulist) and PCI devices' numa_node (kernel bus id → node).
func sysfsTree(online string, nodes map[int]string, pciNodes map[string]int) fstest.MapFS {
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

// DGX A100 as the mock/dgxa100 package models it, plus what that mock
// leaves out. dgxa100 implements the inventory calls (count, handles,
// UUID, name, memory, compute capability, MIG mode) but none of the
// topology calls, and its GetPciInfo leaves BusId empty. dgxServer wraps
// each dgxa100.Device with func fields that answer as a real DGX A100
// does: 12 active NVLinks per GPU (NVLink 3.0), two to each of six
// NVSwitches; the GPUs in PCIe-switch pairs (0,1) (2,3) (4,5) (6,7) (PXB)
// and SYS between pairs (AMD Rome in NPS4: a pair per NUMA node); NUMA
// nodes 3,3,1,1,7,7,5,5 and the CPU affinities nvidia-smi shows there.
var (
	dgxNUMA = []int{3, 3, 1, 1, 7, 7, 5, 5}
	// dgxNodeCPUs: node n has CPUs 16n..16n+15 and 128+16n..128+16n+15.
	dgxNodeCPUs = func(n int) string { return fmt.Sprintf("%d-%d,%d-%d", 16*n, 16*n+15, 128+16*n, 128+16*n+15) }
)

const dgxSwitches = 6

func dgxSwitchBus(s int) string { return fmt.Sprintf("0000:%02x:00.0", 0xc0+s) }

// dgxServer returns the dgxa100 mock with the topology calls added.
// remoteType says whether the library has
// nvmlDeviceGetNvLinkRemoteDeviceType (older drivers lack it).
func dgxServer(remoteType bool) *dgxa100.Server {
	s := dgxa100.New()
	s.LookupSymbolFunc = func(sym string) error {
		if sym == "nvmlDeviceGetNvLinkRemoteDeviceType" && !remoteType {
			return errors.New("symbol not found")
		}
		return nil
	}
	devs := make([]*dgxa100.Device, len(s.Devices))
	for i, d := range s.Devices {
		devs[i] = d.(*dgxa100.Device)
	}
	pair := func(d gonvml.Device) int {
		for i, e := range devs {
			if gonvml.Device(e) == d {
				return i / 2
			}
		}
		return -1
	}
	for i, d := range devs {
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			return gonvml.PciInfo{PciDeviceId: 0x20B010DE, Bus: uint32(i), BusId: busID(d.PciBusID)}, gonvml.SUCCESS
		}
		d.GetCpuAffinityFunc = func(int) ([]uint, gonvml.Return) {
			return listToMask(mustList(dgxNodeCPUs(dgxNUMA[i]))), gonvml.SUCCESS
		}
		d.GetMemoryAffinityFunc = func(int, gonvml.AffinityScope) ([]uint, gonvml.Return) {
			return listToMask(CPUList{dgxNUMA[i]}), gonvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link >= 12 {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			// 0x1AF1 is the A100 generation's NVSwitch.
			return gonvml.PciInfo{PciDeviceId: 0x1AF110DE, BusId: busID(dgxSwitchBus(link / 2))}, gonvml.SUCCESS
		}
		d.GetNvLinkRemoteDeviceTypeFunc = func(int) (gonvml.IntNvLinkDeviceType, gonvml.Return) {
			return gonvml.NVLINK_DEVICE_TYPE_SWITCH, gonvml.SUCCESS
		}
		d.GetNvLinkVersionFunc = func(int) (uint32, gonvml.Return) { return uint32(gonvml.NVLINK_VERSION_3_0), gonvml.SUCCESS }
		d.GetTopologyCommonAncestorFunc = func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
			if pair(other) == i/2 {
				return gonvml.TOPOLOGY_MULTIPLE, gonvml.SUCCESS
			}
			return gonvml.TOPOLOGY_SYSTEM, gonvml.SUCCESS
		}
		d.GetP2PStatusFunc = func(gonvml.Device, gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
			return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
		}
	}
	return s
}

func dgxOptions() []Option {
	nodes := map[int]string{}
	for n := range 8 {
		nodes[n] = dgxNodeCPUs(n)
	}
	return []Option{
		WithSysFS(sysfsTree("0-255", nodes, nil)),
		withCPUFacts(cpuFacts{model: "AMD EPYC 7742 64-Core Processor", sockets: 2, cores: 128, cpus: 256}, nil),
	}
}

// pcieGPU is one GPU of pcieBox.
type pcieGPU struct {
	uuid, bus string
	cpus      string
}

// pcieBox is a PCIe-only server with four A40s across two sockets: GPU0
// and GPU1 behind one PCIe switch on socket 0, GPU2 and GPU3 behind
// another on socket 1. It is built from go-nvml's bare mock.Interface and
// mock.Device, with only the calls discovery makes. Its driver lacks
// nvmlDeviceGetMemoryAffinity, nvmlDeviceGetNumaNodeId and
// nvmlDeviceGetNvLinkRemoteDeviceType, so NUMA nodes come from sysfs.
type pcieBox struct {
	lib  *mock.Interface
	devs []*mock.Device
	gpus []pcieGPU
}

func newPCIeBox() *pcieBox {
	b := &pcieBox{gpus: []pcieGPU{
		{"GPU-0a000000-0000-0000-0000-000000000000", "00000000:1B:00.0", "0-15,32-47"},
		{"GPU-0a000000-0000-0000-0000-000000000001", "00000000:1C:00.0", "0-15,32-47"},
		{"GPU-0a000000-0000-0000-0000-000000000002", "00000000:88:00.0", "16-31,48-63"},
		{"GPU-0a000000-0000-0000-0000-000000000003", "00000000:89:00.0", "16-31,48-63"},
	}}
	index := func(d gonvml.Device) int {
		for i, e := range b.devs {
			if gonvml.Device(e) == d {
				return i
			}
		}
		return -1
	}
	for i, g := range b.gpus {
		d := &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) { return g.uuid, gonvml.SUCCESS },
			GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA A40", gonvml.SUCCESS },
			GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
				return gonvml.Memory{Total: 48 << 30}, gonvml.SUCCESS
			},
			GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) {
				return gonvml.PciInfo{PciDeviceId: 0x223510DE, BusId: busID(g.bus)}, gonvml.SUCCESS
			},
			GetCudaComputeCapabilityFunc: func() (int, int, gonvml.Return) { return 8, 6, gonvml.SUCCESS },
			GetMigModeFunc:               func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
			GetCpuAffinityFunc: func(int) ([]uint, gonvml.Return) {
				return listToMask(mustList(g.cpus)), gonvml.SUCCESS
			},
			GetNvLinkStateFunc: func(int) (gonvml.EnableState, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED },
			GetTopologyCommonAncestorFunc: func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
				if index(other)/2 == i/2 {
					return gonvml.TOPOLOGY_SINGLE, gonvml.SUCCESS
				}
				return gonvml.TOPOLOGY_SYSTEM, gonvml.SUCCESS
			},
			GetP2PStatusFunc: func(other gonvml.Device, idx gonvml.GpuP2PCapsIndex) (gonvml.GpuP2PStatus, gonvml.Return) {
				switch {
				case idx == gonvml.P2P_CAPS_INDEX_NVLINK:
					return gonvml.P2P_STATUS_NOT_SUPPORTED, gonvml.SUCCESS
				case index(other)/2 == i/2:
					return gonvml.P2P_STATUS_OK, gonvml.SUCCESS
				}
				return gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED, gonvml.SUCCESS
			},
		}
		b.devs = append(b.devs, d)
	}
	b.lib = &mock.Interface{
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(b.devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(b.devs) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return b.devs[i], gonvml.SUCCESS
		},
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "535.183.01", gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 12020, gonvml.SUCCESS },
		ExtensionsFunc: func() gonvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(sym string) error {
				switch sym {
				case "nvmlDeviceGetMemoryAffinity", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetNvLinkRemoteDeviceType":
					return errors.New("undefined symbol: " + sym)
				}
				return nil
			}}
		},
	}
	return b
}

func (b *pcieBox) options() []Option {
	return []Option{
		WithSysFS(sysfsTree("0-63", map[int]string{0: "0-15,32-47", 1: "16-31,48-63"},
			map[string]int{"0000:1b:00.0": 0, "0000:1c:00.0": 0, "0000:88:00.0": 1, "0000:89:00.0": 1})),
		withCPUFacts(cpuFacts{model: "Intel(R) Xeon(R) Gold 6326 CPU @ 2.90GHz", sockets: 2, cores: 32, cpus: 64}, nil),
	}
}

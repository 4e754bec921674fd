package nvmltest

import (
	"errors"
	"testing/fstest"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
)

// PCIeGPU is one GPU of a PCIeBox.
type PCIeGPU struct {
	UUID string
	Bus  string // NVML's form: "00000000:1B:00.0"
	CPUs string // its CPU affinity, a kernel cpulist
}

// PCIeBox is a PCIe-only server with four A40s across two sockets: GPU0
// and GPU1 behind one PCIe switch on socket 0 (NUMA node 0: PIX), GPU2
// and GPU3 on two root ports of socket 1's host bridge (node 1: PHB), SYS
// between the sockets. It is built from go-nvml's bare
// mock.Interface and mock.Device, with only the calls discovery makes. Its
// driver lacks nvmlDeviceGetMemoryAffinity, nvmlDeviceGetNumaNodeId and
// nvmlDeviceGetNvLinkRemoteDeviceType, so NUMA nodes come from sysfs
// (SysFS).
//
// Lib answers from Devs as they are when it is called: a test may replace
// a device's func fields, or shorten Devs, after NewPCIeBox.
type PCIeBox struct {
	Lib  *mock.Interface
	Devs []*mock.Device
	GPUs []PCIeGPU
}

// NewPCIeBox returns the box.
func NewPCIeBox() *PCIeBox {
	b := &PCIeBox{GPUs: []PCIeGPU{
		{"GPU-0a000000-0000-0000-0000-000000000000", "00000000:1B:00.0", "0-15,32-47"},
		{"GPU-0a000000-0000-0000-0000-000000000001", "00000000:1C:00.0", "0-15,32-47"},
		{"GPU-0a000000-0000-0000-0000-000000000002", "00000000:88:00.0", "16-31,48-63"},
		{"GPU-0a000000-0000-0000-0000-000000000003", "00000000:89:00.0", "16-31,48-63"},
	}}
	index := func(d gonvml.Device) int {
		for i, e := range b.Devs {
			if gonvml.Device(e) == d {
				return i
			}
		}
		return -1
	}
	for i, g := range b.GPUs {
		d := &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) { return g.UUID, gonvml.SUCCESS },
			GetNameFunc: func() (string, gonvml.Return) { return "NVIDIA A40", gonvml.SUCCESS },
			GetMemoryInfoFunc: func() (gonvml.Memory, gonvml.Return) {
				return gonvml.Memory{Total: 48 << 30}, gonvml.SUCCESS
			},
			GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) {
				return gonvml.PciInfo{PciDeviceId: 0x223510DE, BusId: BusID(g.Bus)}, gonvml.SUCCESS
			},
			GetCudaComputeCapabilityFunc: func() (int, int, gonvml.Return) { return 8, 6, gonvml.SUCCESS },
			GetMigModeFunc:               func() (int, int, gonvml.Return) { return 0, 0, gonvml.ERROR_NOT_SUPPORTED },
			GetCpuAffinityFunc: func(int) ([]uint, gonvml.Return) {
				return Mask(cpus(g.CPUs)), gonvml.SUCCESS
			},
			GetNvLinkStateFunc: func(int) (gonvml.EnableState, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED },
			GetTopologyCommonAncestorFunc: func(other gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
				switch {
				case index(other)/2 == i/2 && i < 2:
					return gonvml.TOPOLOGY_SINGLE, gonvml.SUCCESS
				case index(other)/2 == i/2:
					return gonvml.TOPOLOGY_HOSTBRIDGE, gonvml.SUCCESS
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
		b.Devs = append(b.Devs, d)
	}
	b.Lib = &mock.Interface{
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(b.Devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i < 0 || i >= len(b.Devs) {
				return nil, gonvml.ERROR_INVALID_ARGUMENT
			}
			return b.Devs[i], gonvml.SUCCESS
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

// SysFS is the box's /sys: CPUs 0-63 online, NUMA node 0 with 0-15,32-47
// and node 1 with 16-31,48-63, and each GPU's numa_node (0, 0, 1, 1).
func (b *PCIeBox) SysFS() fstest.MapFS {
	return SysFS("0-63", map[int]string{0: "0-15,32-47", 1: "16-31,48-63"},
		map[string]int{"0000:1b:00.0": 0, "0000:1c:00.0": 0, "0000:88:00.0": 1, "0000:89:00.0": 1})
}

// CPU is what gopsutil says about the box's CPUs.
func (b *PCIeBox) CPU() CPUInfo {
	return CPUInfo{Model: "Intel(R) Xeon(R) Gold 6326 CPU @ 2.90GHz", Sockets: 2, Cores: 32, CPUs: 64}
}

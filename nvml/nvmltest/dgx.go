package nvmltest

import (
	"errors"
	"fmt"
	"testing/fstest"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// DGXNUMA returns the NUMA node of each of the DGX A100's eight GPUs, by
// index: 3,3,1,1,7,7,5,5.
func DGXNUMA() []int { return []int{3, 3, 1, 1, 7, 7, 5, 5} }

// DGXNodeCPUs is NUMA node n's cpulist on the DGX A100 (two 64-core AMD
// EPYC 7742 in NPS4, SMT on): CPUs 16n..16n+15 and their SMT siblings
// 128+16n..128+16n+15.
func DGXNodeCPUs(n int) string {
	return fmt.Sprintf("%d-%d,%d-%d", 16*n, 16*n+15, 128+16*n, 128+16*n+15)
}

// DGXCPU is what gopsutil says about the DGX A100's CPUs.
func DGXCPU() CPUInfo {
	return CPUInfo{Model: "AMD EPYC 7742 64-Core Processor", Sockets: 2, Cores: 128, CPUs: 256}
}

// DGXSysFS is the DGX A100's /sys: CPUs 0-255 online, eight NUMA nodes
// (DGXNodeCPUs), and no PCI numa_node files (NVML's memory affinity names
// the GPUs' nodes).
func DGXSysFS() fstest.MapFS {
	nodes := map[int]string{}
	for n := range 8 {
		nodes[n] = DGXNodeCPUs(n)
	}
	return SysFS("0-255", nodes, nil)
}

const dgxSwitches = 6

func dgxSwitchBus(s int) string { return fmt.Sprintf("0000:%02x:00.0", 0xc0+s) }

// DGXA100 is a DGX A100 as the mock/dgxa100 package models it, plus what
// that mock leaves out. dgxa100 implements the inventory calls (count,
// handles, UUID, name, memory, compute capability, MIG mode) but none of
// the topology calls, and its GetPciInfo leaves BusId empty. DGXA100 wraps
// each dgxa100.Device with func fields that answer as a real DGX A100
// does: 12 active NVLinks per GPU (NVLink 3.0), two to each of six
// NVSwitches; the GPUs in PCIe-switch pairs (0,1) (2,3) (4,5) (6,7) (PXB)
// and SYS between pairs (AMD Rome in NPS4: a pair per NUMA node); NUMA
// nodes 3,3,1,1,7,7,5,5 (DGXNUMA) and the CPU affinities nvidia-smi shows
// there (DGXNodeCPUs). Pair it with DGXSysFS and DGXCPU.
//
// remoteType says whether the library has
// nvmlDeviceGetNvLinkRemoteDeviceType (older drivers lack it); every other
// symbol is found. The polled health checks, the event calls and the
// telemetry calls are left as dgxa100 has them (unset: calling them
// panics); see QuietPolls, NewEvents and NewTelemetry.
func DGXA100(remoteType bool) *dgxa100.Server {
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
	numa := DGXNUMA()
	for i, d := range devs {
		d.GetPciInfoFunc = func() (gonvml.PciInfo, gonvml.Return) {
			return gonvml.PciInfo{PciDeviceId: 0x20B010DE, Bus: uint32(i), BusId: BusID(d.PciBusID)}, gonvml.SUCCESS
		}
		d.GetCpuAffinityFunc = func(int) ([]uint, gonvml.Return) {
			return Mask(cpus(DGXNodeCPUs(numa[i]))), gonvml.SUCCESS
		}
		d.GetMemoryAffinityFunc = func(int, gonvml.AffinityScope) ([]uint, gonvml.Return) {
			return Mask([]int{numa[i]}), gonvml.SUCCESS
		}
		d.GetNumaNodeIdFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
		d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			if link >= 2*dgxSwitches {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			// 0x1AF1 is the A100 generation's NVSwitch.
			return gonvml.PciInfo{PciDeviceId: 0x1AF110DE, BusId: BusID(dgxSwitchBus(link / 2))}, gonvml.SUCCESS
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

package nvml

import (
	"encoding/json"
	"strconv"
)

// Topology is what Discover finds on one node: the GPUs, how every pair is
// linked, and the CPU/NUMA layout they attach to. Its JSON field names are
// stable.
type Topology struct {
	// Driver is the NVIDIA driver version ("550.54.15").
	Driver string `json:"driver_version"`
	// CUDA is the newest CUDA version the driver supports ("12.4").
	CUDA string `json:"cuda_driver_version"`
	// GPUs are in NVML index order (nvidia-smi's, and CUDA's with
	// CUDA_DEVICE_ORDER=PCI_BUS_ID); GPUs[i].Index == i.
	GPUs []GPU `json:"gpus"`
	// Links[i][j] is how GPU i reaches GPU j; Links[i][i] is the GPU
	// itself (class "X").
	Links [][]Link `json:"links"`
	// NVSwitch is true when any GPU has an NVLink to an NVSwitch.
	NVSwitch bool `json:"nvswitch"`
	// Host is the CPU and NUMA layout.
	Host HostInfo `json:"host"`
	// Notes are what could not be read: "GPU2: uuid: ERROR_UNKNOWN". The
	// fields concerned are left empty (or -1, or an unknown link class);
	// everything else is still filled in.
	Notes []string `json:"notes,omitempty"`
}

// GPU is one NVIDIA GPU as NVML reports it.
type GPU struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// MemoryTotal is the framebuffer size in bytes.
	MemoryTotal uint64 `json:"memory_total_bytes"`
	// BusID is the PCI address in NVML's form, "00000000:07:00.0".
	BusID string `json:"pci_bus_id"`
	// NUMANode is the NUMA node the GPU is attached to (nvidia-smi's "NUMA
	// Affinity"), -1 when unknown. See Discover for where it comes from.
	NUMANode int `json:"numa_node"`
	// GPUNUMANode is the NUMA node made of the GPU's own memory on
	// platforms where GPU memory is a NUMA node (Grace Hopper; nvidia-smi's
	// "GPU NUMA ID"), -1 elsewhere.
	GPUNUMANode int `json:"gpu_numa_id"`
	// CPUAffinity are the CPUs close to the GPU (nvidia-smi's "CPU
	// Affinity"), empty when unknown.
	CPUAffinity CPUList `json:"cpu_affinity"`
	// ComputeCapability is CUDA's "major.minor" ("8.0").
	ComputeCapability string `json:"compute_capability"`
	// MIG is the current MIG mode: MIGEnabled, MIGDisabled, or
	// MIGUnsupported (pre-Ampere GPUs, or not readable).
	MIG string `json:"mig_mode"`
	// MIGPending is the MIG mode after the next GPU reset, when it differs
	// from MIG.
	MIGPending string `json:"mig_pending,omitempty"`
	// NVLinks counts the GPU's active NVLinks (to GPUs, NVSwitches or
	// CPUs); NVSwitchLinks those that end at an NVSwitch.
	NVLinks       int `json:"nvlinks"`
	NVSwitchLinks int `json:"nvswitch_links"`
	// Error is set when NVML gave no handle for this GPU at all; every
	// other field but Index is then empty.
	Error string `json:"error,omitempty"`
}

// MIG modes of GPU.MIG.
const (
	MIGEnabled     = "enabled"
	MIGDisabled    = "disabled"
	MIGUnsupported = "unsupported"
)

// PathClass is the PCIe path between two GPUs, in nvidia-smi topo -m's
// words, from the nearest to the farthest.
type PathClass string

// Path classes. NVML's NVML_TOPOLOGY_INTERNAL (two GPUs on one board, such
// as a Tesla K80) is reported as PathPIX: nvidia-smi has no class of its
// own for it, and the board's GPUs sit behind its own PCIe switch.
const (
	PathSelf PathClass = "X"    // the GPU itself
	PathPIX  PathClass = "PIX"  // at most one PCIe bridge (NVML_TOPOLOGY_SINGLE)
	PathPXB  PathClass = "PXB"  // several PCIe bridges, no host bridge (NVML_TOPOLOGY_MULTIPLE)
	PathPHB  PathClass = "PHB"  // a PCIe host bridge (NVML_TOPOLOGY_HOSTBRIDGE)
	PathNODE PathClass = "NODE" // host bridges within one NUMA node (NVML_TOPOLOGY_NODE)
	PathSYS  PathClass = "SYS"  // the SMP interconnect between NUMA nodes (NVML_TOPOLOGY_SYSTEM)
)

// P2PStatus is NVML's peer-to-peer status for a pair of GPUs in nvidia-smi
// topo -p2p's codes: "X" (self), "OK", "CNS" (chipset not supported), "GNS"
// (GPU not supported), "TNS" (topology not supported), "NS" (not
// supported), "DR" (disabled by a registry key; ours, nvidia-smi has no
// code for it) and "U" (unknown, or not readable).
type P2PStatus string

// Link is how one GPU reaches another.
type Link struct {
	// NVLinks is the number of active NVLinks bonded between the two GPUs:
	// the direct ones plus, when both GPUs have NVLinks to NVSwitches, the
	// smaller of their two NVSwitch link counts (every NVSwitch port of a
	// GPU reaches every other GPU of the fabric, as on DGX/HGX boards).
	NVLinks int `json:"nvlinks"`
	// NVLinkVersion is the NVLink generation ("3.0"), "" without NVLink.
	NVLinkVersion string `json:"nvlink_version,omitempty"`
	// ViaNVSwitch is true when the NVLinks go through NVSwitches.
	ViaNVSwitch bool `json:"via_nvswitch,omitempty"`
	// PCIe is the PCIe path, PathSelf for the GPU itself, "" when unknown.
	PCIe PathClass `json:"pcie"`
	// P2PRead and P2PNVLink are NVML's P2P status for reads over PCIe and
	// over NVLink (P2P_CAPS_INDEX_READ, P2P_CAPS_INDEX_NVLINK).
	P2PRead   P2PStatus `json:"p2p_read"`
	P2PNVLink P2PStatus `json:"p2p_nvlink"`
}

// Class is the link as nvidia-smi topo -m shows it: "X", "NV12", "PIX",
// "PXB", "PHB", "NODE", "SYS", or "N/A" when nothing could be read.
func (l Link) Class() string {
	switch {
	case l.PCIe == PathSelf:
		return string(PathSelf)
	case l.NVLinks > 0:
		return "NV" + strconv.Itoa(l.NVLinks)
	case l.PCIe != "":
		return string(l.PCIe)
	}
	return "N/A"
}

// MarshalJSON adds "class", Class's answer, to the fields. Unmarshalling
// ignores it.
func (l Link) MarshalJSON() ([]byte, error) {
	type plain Link
	return json.Marshal(struct {
		Class string `json:"class"`
		plain
	}{l.Class(), plain(l)})
}

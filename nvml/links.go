package nvml

import (
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// nvidiaVendorID is NVIDIA's PCI vendor id, the low 16 bits of
// PciInfo.PciDeviceId.
const nvidiaVendorID = 0x10de

// nvlinkEnds is what one GPU's NVLinks reach.
type nvlinkEnds struct {
	toGPU    map[int]int // peer GPU index → active links
	toSwitch int
	other    int    // CPUs (IBM NPU) and GPUs not in the list
	version  string // the highest generation seen
	rank     gonvml.NvlinkVersion
}

// links fills d.t.Links, the GPUs' NVLink counts and d.t.NVSwitch.
func (d *discovery) links() {
	n := len(d.devs)
	byBus := make(map[string]int, n)
	for i, g := range d.t.GPUs {
		if addr, ok := sysfsBusID(g.BusID); ok {
			byBus[addr] = i
		}
	}
	ends := make([]nvlinkEnds, n)
	for i, dev := range d.devs {
		if dev != nil {
			ends[i] = d.nvlinks(i, dev, byBus)
			g := &d.t.GPUs[i]
			g.NVSwitchLinks = ends[i].toSwitch
			g.NVLinks = ends[i].toSwitch + ends[i].other
			for _, k := range ends[i].toGPU {
				g.NVLinks += k
			}
			if g.NVSwitchLinks > 0 {
				d.t.NVSwitch = true
			}
		}
	}

	hasP2P := d.has("nvmlDeviceGetP2PStatus")
	d.t.Links = make([][]Link, n)
	for i := range n {
		d.t.Links[i] = make([]Link, n)
	}
	for i := range n {
		d.t.Links[i][i] = Link{PCIe: PathSelf, P2PRead: "X", P2PNVLink: "X"}
		for j := range n {
			if j == i {
				continue
			}
			l := &d.t.Links[i][j]
			l.P2PRead, l.P2PNVLink = "U", "U"
			a, b := d.devs[i], d.devs[j]
			if a == nil || b == nil {
				continue
			}
			if j > i {
				lvl, ret := a.GetTopologyCommonAncestor(b)
				if ret == gonvml.SUCCESS {
					l.PCIe = pathClass(lvl)
				} else {
					d.note("GPU%d-GPU%d: PCIe path: %v", i, j, ret)
				}
			} else {
				l.PCIe = d.t.Links[j][i].PCIe
			}
			l.NVLinks = ends[i].toGPU[j]
			if ends[i].toSwitch > 0 && ends[j].toSwitch > 0 {
				l.NVLinks += min(ends[i].toSwitch, ends[j].toSwitch)
				l.ViaNVSwitch = true
			}
			if l.NVLinks > 0 {
				l.NVLinkVersion = ends[i].version
				if ends[j].rank < ends[i].rank {
					l.NVLinkVersion = ends[j].version
				}
			}
			if hasP2P {
				l.P2PRead = d.p2p(i, j, a, b, gonvml.P2P_CAPS_INDEX_READ, "read")
				l.P2PNVLink = d.p2p(i, j, a, b, gonvml.P2P_CAPS_INDEX_NVLINK, "NVLink")
			}
		}
	}
}

// nvlinks walks GPU i's NVLinks.
func (d *discovery) nvlinks(i int, dev gonvml.Device, byBus map[string]int) nvlinkEnds {
	e := nvlinkEnds{toGPU: map[int]int{}}
	remoteType := d.has("nvmlDeviceGetNvLinkRemoteDeviceType")
	for link := range gonvml.NVLINK_MAX_LINKS {
		state, ret := dev.GetNvLinkState(link)
		switch {
		case ret == gonvml.SUCCESS:
		case link == 0 && unsupported(ret):
			return e // no NVLink on this GPU
		case unsupported(ret) || ret == gonvml.ERROR_INVALID_ARGUMENT:
			continue // fewer links than NVLINK_MAX_LINKS
		default:
			d.note("GPU%d: NVLink %d state: %v", i, link, ret)
			continue
		}
		if state != gonvml.FEATURE_ENABLED {
			continue
		}
		pci, ret := dev.GetNvLinkRemotePciInfo(link)
		if ret != gonvml.SUCCESS {
			d.note("GPU%d: NVLink %d remote PCI info: %v", i, link, ret)
			continue
		}
		addr, _ := sysfsBusID(cString(pci.BusId[:]))
		peer, isGPU := byBus[addr]
		kind := gonvml.NVLINK_DEVICE_TYPE_UNKNOWN
		if remoteType {
			if k, ret := dev.GetNvLinkRemoteDeviceType(link); ret == gonvml.SUCCESS {
				kind = k
			}
		}
		if kind == gonvml.NVLINK_DEVICE_TYPE_UNKNOWN {
			switch {
			case isGPU:
				kind = gonvml.NVLINK_DEVICE_TYPE_GPU
			case pci.PciDeviceId&0xffff == nvidiaVendorID:
				kind = gonvml.NVLINK_DEVICE_TYPE_SWITCH
			default:
				kind = gonvml.NVLINK_DEVICE_TYPE_IBMNPU
			}
		}
		switch {
		case kind == gonvml.NVLINK_DEVICE_TYPE_SWITCH:
			e.toSwitch++
		case kind == gonvml.NVLINK_DEVICE_TYPE_GPU && isGPU && peer != i:
			e.toGPU[peer]++
		default:
			e.other++
		}
		if v, ret := dev.GetNvLinkVersion(link); ret == gonvml.SUCCESS && gonvml.NvlinkVersion(v) > e.rank {
			e.rank = gonvml.NvlinkVersion(v)
			e.version = nvlinkVersion(e.rank)
		}
	}
	return e
}

func (d *discovery) p2p(i, j int, a, b gonvml.Device, idx gonvml.GpuP2PCapsIndex, what string) P2PStatus {
	s, ret := a.GetP2PStatus(b, idx)
	if ret != gonvml.SUCCESS {
		if !unsupported(ret) {
			d.note("GPU%d-GPU%d: P2P %s status: %v", i, j, what, ret)
		}
		return "U"
	}
	switch s {
	case gonvml.P2P_STATUS_OK:
		return "OK"
	case gonvml.P2P_STATUS_CHIPSET_NOT_SUPPORTED:
		return "CNS"
	case gonvml.P2P_STATUS_GPU_NOT_SUPPORTED:
		return "GNS"
	case gonvml.P2P_STATUS_IOH_TOPOLOGY_NOT_SUPPORTED:
		return "TNS"
	case gonvml.P2P_STATUS_DISABLED_BY_REGKEY:
		return "DR"
	case gonvml.P2P_STATUS_NOT_SUPPORTED:
		return "NS"
	}
	return "U"
}

// pathClass maps NVML's common-ancestor level to nvidia-smi's class.
func pathClass(lvl gonvml.GpuTopologyLevel) PathClass {
	switch lvl {
	case gonvml.TOPOLOGY_INTERNAL, gonvml.TOPOLOGY_SINGLE:
		return PathPIX
	case gonvml.TOPOLOGY_MULTIPLE:
		return PathPXB
	case gonvml.TOPOLOGY_HOSTBRIDGE:
		return PathPHB
	case gonvml.TOPOLOGY_NODE:
		return PathNODE
	case gonvml.TOPOLOGY_SYSTEM:
		return PathSYS
	}
	return ""
}

// nvlinkVersion names an nvmlNvlinkVersion_t.
func nvlinkVersion(v gonvml.NvlinkVersion) string {
	switch v {
	case gonvml.NVLINK_VERSION_1_0:
		return "1.0"
	case gonvml.NVLINK_VERSION_2_0:
		return "2.0"
	case gonvml.NVLINK_VERSION_2_2:
		return "2.2"
	case gonvml.NVLINK_VERSION_3_0:
		return "3.0"
	case gonvml.NVLINK_VERSION_3_1:
		return "3.1"
	case gonvml.NVLINK_VERSION_4_0:
		return "4.0"
	case gonvml.NVLINK_VERSION_5_0:
		return "5.0"
	}
	return ""
}

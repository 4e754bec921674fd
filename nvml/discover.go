package nvml

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// Option configures Discover and DiscoverHost.
type Option func(*topoOptions)

type topoOptions struct {
	sysfs fs.FS
	// cpuFacts reads the CPU model and counts (gopsutil); tests replace it.
	cpuFacts func(context.Context) (cpuFacts, error)
}

// WithSysFS reads sysfs from fsys, a tree laid out as /sys is, instead of
// /sys: the PCI devices' numa_node files, /sys/devices/system/node and
// /sys/devices/system/cpu.
func WithSysFS(fsys fs.FS) Option { return func(o *topoOptions) { o.sysfs = fsys } }

func newTopoOptions(opts []Option) *topoOptions {
	o := &topoOptions{sysfs: os.DirFS("/sys"), cpuFacts: gopsutilCPUFacts}
	for _, opt := range opts {
		opt(o)
	}
	return o
}

// Load opens the real NVML library (Open), discovers the topology
// (Discover) and shuts NVML down. Without a driver it returns a
// *NoDriverError and no topology: call DiscoverHost for the CPU layout.
func Load(ctx context.Context, opts ...Option) (*Topology, error) {
	lib, err := Open()
	if err != nil {
		return nil, err
	}
	defer lib.Shutdown()
	return Discover(ctx, lib, opts...)
}

// Discover reads the topology of the GPUs that l (an initialized NVML:
// Open, or nvmltest.Lib over a go-nvml mock) reports, and the host's CPU/NUMA layout. It
// fails only when NVML cannot count the GPUs; anything else it cannot read
// becomes a note in Topology.Notes and leaves the field concerned empty.
// A GPU NVML gives no handle for stays in the list, with GPU.Error set, so
// indexes keep matching NVML's. A panic inside lib (a mock missing a
// function) is returned as an error. ctx bounds the host part (gopsutil)
// and is checked between GPUs; NVML calls themselves do not block.
//
// Where the answers come from:
//   - GPU.NUMANode: nvmlDeviceGetMemoryAffinity (scope NODE) when it names
//     exactly one node, else the PCI device's numa_node in sysfs
//     (/sys/bus/pci/devices/<bus id>/numa_node), else -1.
//     nvmlDeviceGetNumaNodeId is not it: it gives the NUMA node made of the
//     GPU's own memory on Grace Hopper-like platforms, GPU.GPUNUMANode.
//   - NVLink: for each of a GPU's NVLinks (up to NVLINK_MAX_LINKS) that
//     nvmlDeviceGetNvLinkState says is active, the far end's PCI address
//     (nvmlDeviceGetNvLinkRemotePciInfo) and kind
//     (nvmlDeviceGetNvLinkRemoteDeviceType: GPU, NVSwitch, IBM NPU). When
//     the kind is not available (an older driver, or UNKNOWN), an address
//     that is one of the GPUs makes a GPU link, another NVIDIA PCI device
//     (vendor 0x10de) an NVSwitch link, anything else a CPU link. See
//     Link.NVLinks for the pair counts.
//   - Link.PCIe: nvmlDeviceGetTopologyCommonAncestor; P2P:
//     nvmlDeviceGetP2PStatus.
//
// Functions that older drivers lack (memory affinity, NUMA node id,
// NVLink remote device type, P2P status, MIG mode) are called only when
// lib.Extensions().LookupSymbol finds them: with go-nvml's lazy binding a
// missing symbol crashes the process. A lib whose Extensions is not
// implemented (a bare mock.Interface) is taken to have none of them.
func Discover(ctx context.Context, l *Lib, opts ...Option) (t *Topology, err error) {
	lib := nvmlapi.Unwrap(l)
	o := newTopoOptions(opts)
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("nvml: panic during GPU discovery: %v", r)
		}
	}()
	d := &discovery{lib: lib, o: o, symbols: map[string]bool{}}
	t = &Topology{GPUs: []GPU{}, Links: [][]Link{}}
	d.t = t

	n, ret := lib.DeviceGetCount()
	if ret != gonvml.SUCCESS {
		return nil, fmt.Errorf("nvml: count GPUs: %w", ret)
	}
	if v, ret := lib.SystemGetDriverVersion(); ret == gonvml.SUCCESS {
		t.Driver = v
	} else {
		d.note("driver version: %v", ret)
	}
	if v, ret := lib.SystemGetCudaDriverVersion(); ret == gonvml.SUCCESS {
		t.CUDA = fmt.Sprintf("%d.%d", v/1000, v%1000/10)
	} else {
		d.note("CUDA driver version: %v", ret)
	}

	host, herr := DiscoverHost(ctx, opts...)
	t.Host = host
	if herr != nil {
		d.note("host: %v", herr)
	}
	// Room for every CPU and node in the affinity masks NVML fills.
	d.cpuSlots, d.nodeSlots = 64, 64
	if k := len(host.OnlineCPUs); k > 0 {
		d.cpuSlots = max(d.cpuSlots, host.OnlineCPUs[k-1]+1)
	}
	d.cpuSlots = max(d.cpuSlots, host.CPUs)
	if k := len(host.NUMANodes); k > 0 {
		d.nodeSlots = max(d.nodeSlots, host.NUMANodes[k-1].ID+1)
	}

	d.devs = make([]gonvml.Device, n)
	for i := range n {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		t.GPUs = append(t.GPUs, d.gpu(i))
	}
	d.links()
	return t, nil
}

// discovery is the state of one Discover call.
type discovery struct {
	lib     gonvml.Interface
	o       *topoOptions
	t       *Topology
	devs    []gonvml.Device // nil where NVML gave no handle
	symbols map[string]bool

	cpuSlots, nodeSlots int
}

func (d *discovery) note(format string, a ...any) {
	d.t.Notes = append(d.t.Notes, fmt.Sprintf(format, a...))
}

// has reports whether the library has an optional NVML function.
func (d *discovery) has(symbol string) (ok bool) {
	if v, seen := d.symbols[symbol]; seen {
		return v
	}
	defer func() {
		if recover() != nil {
			ok = false
		}
		d.symbols[symbol] = ok
	}()
	ext := d.lib.Extensions()
	return ext != nil && ext.LookupSymbol(symbol) == nil
}

// unsupported is true for the answers that mean "this GPU or driver has no
// such thing", which are not worth a note.
func unsupported(ret gonvml.Return) bool {
	return ret == gonvml.ERROR_NOT_SUPPORTED || ret == gonvml.ERROR_FUNCTION_NOT_FOUND
}

func (d *discovery) gpu(i int) GPU {
	g := GPU{Index: i, NUMANode: -1, GPUNUMANode: -1, CPUAffinity: CPUList{}, MIG: MIGUnsupported}
	dev, ret := d.lib.DeviceGetHandleByIndex(i)
	if ret != gonvml.SUCCESS {
		g.Error = fmt.Sprintf("no handle: %v", ret)
		d.note("GPU%d: no handle: %v", i, ret)
		return g
	}
	d.devs[i] = dev
	bad := func(what string, ret gonvml.Return) {
		if !unsupported(ret) {
			d.note("GPU%d: %s: %v", i, what, ret)
		}
	}

	if g.UUID, ret = dev.GetUUID(); ret != gonvml.SUCCESS {
		bad("uuid", ret)
	}
	if g.Name, ret = dev.GetName(); ret != gonvml.SUCCESS {
		bad("name", ret)
	}
	if mem, ret := dev.GetMemoryInfo(); ret == gonvml.SUCCESS {
		g.MemoryTotal = mem.Total
	} else {
		bad("memory info", ret)
	}
	if pci, ret := dev.GetPciInfo(); ret == gonvml.SUCCESS {
		g.BusID = cString(pci.BusId[:])
	} else {
		bad("PCI info", ret)
	}
	if major, minor, ret := dev.GetCudaComputeCapability(); ret == gonvml.SUCCESS {
		g.ComputeCapability = fmt.Sprintf("%d.%d", major, minor)
	} else {
		bad("compute capability", ret)
	}
	if d.has("nvmlDeviceGetMigMode") {
		if cur, pending, ret := dev.GetMigMode(); ret == gonvml.SUCCESS {
			g.MIG = migMode(cur)
			if pending != cur {
				g.MIGPending = migMode(pending)
			}
		} else {
			bad("MIG mode", ret)
		}
	}
	if mask, ret := dev.GetCpuAffinity(d.cpuSlots); ret == gonvml.SUCCESS {
		g.CPUAffinity = maskToList(mask)
	} else {
		bad("CPU affinity", ret)
	}
	if d.has("nvmlDeviceGetMemoryAffinity") {
		if mask, ret := dev.GetMemoryAffinity(d.nodeSlots, gonvml.AFFINITY_SCOPE_NODE); ret == gonvml.SUCCESS {
			if nodes := maskToList(mask); len(nodes) == 1 {
				g.NUMANode = nodes[0]
			}
		} else {
			bad("memory affinity", ret)
		}
	}
	if g.NUMANode < 0 && g.BusID != "" {
		g.NUMANode = d.sysfsNUMANode(g.BusID)
	}
	if d.has("nvmlDeviceGetNumaNodeId") {
		if node, ret := dev.GetNumaNodeId(); ret == gonvml.SUCCESS {
			g.GPUNUMANode = node
		} else {
			bad("GPU NUMA node id", ret)
		}
	}
	return g
}

func migMode(m int) string {
	if m == gonvml.DEVICE_MIG_ENABLE {
		return MIGEnabled
	}
	return MIGDisabled
}

// sysfsNUMANode reads the numa_node of a PCI device, -1 when it cannot
// (or the kernel says -1: no NUMA information).
func (d *discovery) sysfsNUMANode(busID string) int {
	addr, ok := sysfsBusID(busID)
	if !ok {
		return -1
	}
	b, err := fs.ReadFile(d.o.sysfs, "bus/pci/devices/"+addr+"/numa_node")
	if err != nil {
		return -1
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// sysfsBusID turns an NVML bus id ("00000000:07:00.0") into the
// kernel's form ("0000:07:00.0"), which also serves to compare addresses.
func sysfsBusID(id string) (string, bool) {
	id = strings.ToLower(strings.TrimSpace(id))
	parts := strings.Split(id, ":")
	if len(parts) == 2 { // bus:dev.fn, domain 0
		parts = append([]string{"0"}, parts...)
	}
	if len(parts) != 3 {
		return "", false
	}
	dom, err1 := strconv.ParseUint(parts[0], 16, 32)
	bus, err2 := strconv.ParseUint(parts[1], 16, 8)
	devFn := parts[2]
	dev, fn, ok := strings.Cut(devFn, ".")
	dv, err3 := strconv.ParseUint(dev, 16, 8)
	fv, err4 := strconv.ParseUint(fn, 16, 8)
	if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil {
		return "", false
	}
	return fmt.Sprintf("%04x:%02x:%02x.%x", dom, bus, dv, fv), true
}

// cString is a NUL-terminated byte array as a string.
func cString(b []uint8) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}

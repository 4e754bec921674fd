package nvml

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

const dgxMatrix = "\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
	"GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t48-63,176-191\t3\t\tN/A\n" +
	"GPU1\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t48-63,176-191\t3\t\tN/A\n" +
	"GPU2\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\t16-31,144-159\t1\t\tN/A\n" +
	"GPU3\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\t16-31,144-159\t1\t\tN/A\n" +
	"GPU4\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\t112-127,240-255\t7\t\tN/A\n" +
	"GPU5\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\t112-127,240-255\t7\t\tN/A\n" +
	"GPU6\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\t80-95,208-223\t5\t\tN/A\n" +
	"GPU7\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \t80-95,208-223\t5\t\tN/A\n" +
	legendGolden

const legendGolden = `
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
`

const pcieMatrix = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
	"GPU0\t X \tPIX\tSYS\tSYS\t0-15,32-47\t0\t\tN/A\n" +
	"GPU1\tPIX\t X \tSYS\tSYS\t0-15,32-47\t0\t\tN/A\n" +
	"GPU2\tSYS\tSYS\t X \tPHB\t16-31,48-63\t1\t\tN/A\n" +
	"GPU3\tSYS\tSYS\tPHB\t X \t16-31,48-63\t1\t\tN/A\n" +
	legendGolden

func matrix(t *testing.T, topo *Topology) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteMatrix(&b, topo); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestDiscoverDGXA100(t *testing.T) {
	for _, tc := range []struct {
		name       string
		remoteType bool
	}{
		{"remote device type API", true},
		{"NVSwitch by PCI vendor, older driver", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := dgxServer(tc.remoteType)
			topo, err := Discover(t.Context(), nvmltest.Lib(srv), dgxOptions()...)
			if err != nil {
				t.Fatal(err)
			}
			if len(topo.Notes) != 0 {
				t.Errorf("notes: got %q, want none", topo.Notes)
			}
			if topo.Driver != "550.54.15" || topo.CUDA != "12.4" {
				t.Errorf("versions: got driver %q CUDA %q, want 550.54.15 and 12.4", topo.Driver, topo.CUDA)
			}
			if !topo.NVSwitch {
				t.Error("NVSwitch: got false, want true")
			}
			if len(topo.GPUs) != 8 {
				t.Fatalf("GPUs: got %d, want 8", len(topo.GPUs))
			}
			for i, g := range topo.GPUs {
				d := srv.Devices[i].(*dgxa100.Device)
				want := GPU{
					Index: i, UUID: d.UUID, Name: "Mock NVIDIA A100-SXM4-40GB", MemoryTotal: 42949672960,
					BusID: d.PciBusID, NUMANode: dgxNUMA[i], GPUNUMANode: -1,
					CPUAffinity: mustList(dgxNodeCPUs(dgxNUMA[i])), ComputeCapability: "8.0", MIG: MIGDisabled,
					NVLinks: 12, NVSwitchLinks: 12,
				}
				if !reflect.DeepEqual(g, want) {
					t.Errorf("GPU%d:\ngot  %+v\nwant %+v", i, g, want)
				}
			}
			for i := range 8 {
				for j := range 8 {
					l := topo.Links[i][j]
					want := Link{NVLinks: 12, NVLinkVersion: "3.0", ViaNVSwitch: true, PCIe: PathSYS, P2PRead: "OK", P2PNVLink: "OK"}
					switch {
					case i == j:
						want = Link{PCIe: PathSelf, P2PRead: "X", P2PNVLink: "X"}
					case i/2 == j/2:
						want.PCIe = PathPXB
					}
					if l != want {
						t.Errorf("link GPU%d-GPU%d: got %+v, want %+v", i, j, l, want)
					}
				}
			}
			if got := matrix(t, topo); got != dgxMatrix {
				t.Errorf("matrix:\ngot\n%s\nwant\n%s", got, dgxMatrix)
			}
			// A function the library lacks is never called.
			calls := len(srv.Devices[0].(*dgxa100.Device).GetNvLinkRemoteDeviceTypeCalls())
			if want := map[bool]int{true: 12, false: 0}[tc.remoteType]; calls != want {
				t.Errorf("GetNvLinkRemoteDeviceType calls: got %d, want %d", calls, want)
			}
		})
	}
}

func TestDiscoverMIGPending(t *testing.T) {
	srv := dgxServer(true)
	srv.Devices[3].(*dgxa100.Device).MigMode = gonvml.DEVICE_MIG_ENABLE
	srv.Devices[5].(*dgxa100.Device).GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 1, gonvml.SUCCESS }
	topo, err := Discover(t.Context(), nvmltest.Lib(srv), dgxOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gpu          int
		mig, pending string
	}{{0, MIGDisabled, ""}, {3, MIGEnabled, ""}, {5, MIGDisabled, MIGEnabled}} {
		g := topo.GPUs[tc.gpu]
		if g.MIG != tc.mig || g.MIGPending != tc.pending {
			t.Errorf("GPU%d MIG: got %q pending %q, want %q pending %q", tc.gpu, g.MIG, g.MIGPending, tc.mig, tc.pending)
		}
	}
}

func TestDiscoverPCIeBox(t *testing.T) {
	box := newPCIeBox()
	topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.Notes) != 0 {
		t.Errorf("notes: got %q, want none", topo.Notes)
	}
	if topo.NVSwitch {
		t.Error("NVSwitch: got true, want false")
	}
	if topo.Driver != "535.183.01" || topo.CUDA != "12.2" {
		t.Errorf("versions: got driver %q CUDA %q, want 535.183.01 and 12.2", topo.Driver, topo.CUDA)
	}
	numa := []int{0, 0, 1, 1}
	for i, g := range topo.GPUs {
		want := GPU{
			Index: i, UUID: box.GPUs[i].UUID, Name: "NVIDIA A40", MemoryTotal: 48 << 30, BusID: box.GPUs[i].Bus,
			NUMANode: numa[i], GPUNUMANode: -1, CPUAffinity: mustList(box.GPUs[i].CPUs),
			ComputeCapability: "8.6", MIG: MIGUnsupported,
		}
		if !reflect.DeepEqual(g, want) {
			t.Errorf("GPU%d:\ngot  %+v\nwant %+v", i, g, want)
		}
	}
	for _, tc := range []struct {
		i, j  int
		class string
		read  P2PStatus
	}{
		{0, 0, "X", "X"}, {0, 1, "PIX", "OK"}, {1, 0, "PIX", "OK"}, {2, 3, "PHB", "OK"}, {3, 2, "PHB", "OK"},
		{0, 2, "SYS", "CNS"}, {0, 3, "SYS", "CNS"}, {1, 2, "SYS", "CNS"}, {3, 1, "SYS", "CNS"},
	} {
		l := topo.Links[tc.i][tc.j]
		if l.Class() != tc.class || l.P2PRead != tc.read || l.NVLinks != 0 {
			t.Errorf("GPU%d-GPU%d: got %s read %s nvlinks %d, want %s read %s nvlinks 0", tc.i, tc.j, l.Class(), l.P2PRead, l.NVLinks, tc.class, tc.read)
		}
		if tc.i != tc.j && l.P2PNVLink != "NS" {
			t.Errorf("GPU%d-GPU%d: NVLink P2P got %s, want NS", tc.i, tc.j, l.P2PNVLink)
		}
	}
	// NVLink: only link 0 is asked, for every GPU; the optional functions
	// the driver lacks are never called.
	for i, d := range box.Devs {
		if n := len(d.GetNvLinkStateCalls()); n != 1 {
			t.Errorf("GPU%d: GetNvLinkState called %d times, want 1", i, n)
		}
	}
	if got := matrix(t, topo); got != pcieMatrix {
		t.Errorf("matrix:\ngot\n%s\nwant\n%s", got, pcieMatrix)
	}
}

// TestDiscoverNVLinkBridge: two GPUs joined by an NVLink bridge (four
// links), the peer found by its PCI address because the driver cannot name
// the far end's kind; a fifth link ends at something else (a CPU).
func TestDiscoverNVLinkBridge(t *testing.T) {
	box := newPCIeBox()
	box.Devs = box.Devs[:2]
	for i, d := range box.Devs {
		peer := box.GPUs[1-i].Bus
		d.GetNvLinkStateFunc = func(link int) (gonvml.EnableState, gonvml.Return) {
			switch {
			case link < 5:
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			case link < 6:
				return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		}
		d.GetNvLinkRemotePciInfoFunc = func(link int) (gonvml.PciInfo, gonvml.Return) {
			if link == 4 {
				return gonvml.PciInfo{PciDeviceId: 0x04ea1014, BusId: busID("00000000:00:01.0")}, gonvml.SUCCESS
			}
			return gonvml.PciInfo{PciDeviceId: 0x223510DE, BusId: busID(strings.ToLower(peer))}, gonvml.SUCCESS
		}
		d.GetNvLinkVersionFunc = func(int) (uint32, gonvml.Return) { return uint32(gonvml.NVLINK_VERSION_3_1), gonvml.SUCCESS }
	}
	topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
	if err != nil {
		t.Fatal(err)
	}
	if topo.NVSwitch {
		t.Error("NVSwitch: got true, want false")
	}
	l := topo.Links[0][1]
	if l.Class() != "NV4" || l.ViaNVSwitch || l.NVLinkVersion != "3.1" || l.PCIe != PathPIX {
		t.Errorf("GPU0-GPU1: got %+v (%s), want NV4 over NVLink 3.1, PCIe PIX", l, l.Class())
	}
	if g := topo.GPUs[0]; g.NVLinks != 5 || g.NVSwitchLinks != 0 {
		t.Errorf("GPU0 links: got %d (%d to NVSwitch), want 5 (0)", g.NVLinks, g.NVSwitchLinks)
	}
}

func TestDiscoverErrors(t *testing.T) {
	t.Run("one GPU's UUID", func(t *testing.T) {
		box := newPCIeBox()
		box.Devs[2].GetUUIDFunc = func() (string, gonvml.Return) { return "", gonvml.ERROR_UNKNOWN }
		topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"GPU2: uuid: " + gonvml.ERROR_UNKNOWN.Error()}
		if !reflect.DeepEqual(topo.Notes, want) {
			t.Errorf("notes: got %q, want %q", topo.Notes, want)
		}
		if g := topo.GPUs[2]; g.UUID != "" || g.Name != "NVIDIA A40" || g.NUMANode != 1 {
			t.Errorf("GPU2: got %+v, want no UUID, the rest read", g)
		}
		if got := matrix(t, topo); got != pcieMatrix {
			t.Errorf("matrix:\ngot\n%s\nwant\n%s", got, pcieMatrix)
		}
	})
	t.Run("one GPU without a handle", func(t *testing.T) {
		box := newPCIeBox()
		get := box.Lib.DeviceGetHandleByIndexFunc
		box.Lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
			if i == 1 {
				return nil, gonvml.ERROR_GPU_IS_LOST
			}
			return get(i)
		}
		topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
		if err != nil {
			t.Fatal(err)
		}
		lost := gonvml.ERROR_GPU_IS_LOST.Error()
		if g := topo.GPUs[1]; g.Error != "no handle: "+lost || g.Index != 1 || g.UUID != "" {
			t.Errorf("GPU1: got %+v, want an error", g)
		}
		if want := []string{"GPU1: no handle: " + lost}; !reflect.DeepEqual(topo.Notes, want) {
			t.Errorf("notes: got %q, want %q", topo.Notes, want)
		}
		want := "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
			"GPU0\t X \tN/A\tSYS\tSYS\t0-15,32-47\t0\t\tN/A\n" +
			"GPU1\tN/A\t X \tN/A\tN/A\tN/A\tN/A\t\tN/A\n" +
			"GPU2\tSYS\tN/A\t X \tPHB\t16-31,48-63\t1\t\tN/A\n" +
			"GPU3\tSYS\tN/A\tPHB\t X \t16-31,48-63\t1\t\tN/A\n" + legendGolden
		if got := matrix(t, topo); got != want {
			t.Errorf("matrix:\ngot\n%s\nwant\n%s", got, want)
		}
	})
	t.Run("a pair's PCIe path", func(t *testing.T) {
		box := newPCIeBox()
		box.Devs[0].GetTopologyCommonAncestorFunc = func(gonvml.Device) (gonvml.GpuTopologyLevel, gonvml.Return) {
			return 0, gonvml.ERROR_UNKNOWN
		}
		topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
		if err != nil {
			t.Fatal(err)
		}
		if len(topo.Notes) != 3 || topo.Links[0][1].Class() != "N/A" || topo.Links[1][0].Class() != "N/A" || topo.Links[1][2].Class() != "SYS" {
			t.Errorf("got notes %q, links %v", topo.Notes, topo.Links[0])
		}
	})
	t.Run("GPU count", func(t *testing.T) {
		box := newPCIeBox()
		box.Lib.DeviceGetCountFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_UNINITIALIZED }
		topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
		if err == nil || topo != nil || !errors.Is(err, gonvml.ERROR_UNINITIALIZED) {
			t.Errorf("got %v, %v; want no topology and ERROR_UNINITIALIZED", topo, err)
		}
	})
	t.Run("mock without a function", func(t *testing.T) {
		box := newPCIeBox()
		box.Devs[1].GetCudaComputeCapabilityFunc = nil
		topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
		if err == nil || topo != nil || !strings.Contains(err.Error(), "panic") {
			t.Errorf("got %v, %v; want no topology and a panic turned into an error", topo, err)
		}
	})
	t.Run("cancelled", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		box := newPCIeBox()
		if _, err := Discover(ctx, nvmltest.Lib(box.Lib), box.options()...); !errors.Is(err, context.Canceled) {
			t.Errorf("got %v, want context.Canceled", err)
		}
	})
}

func TestDiscoverNoGPUs(t *testing.T) {
	lib := &mock.Interface{
		DeviceGetCountFunc:             func() (int, gonvml.Return) { return 0, gonvml.SUCCESS },
		SystemGetDriverVersionFunc:     func() (string, gonvml.Return) { return "550.54.15", gonvml.SUCCESS },
		SystemGetCudaDriverVersionFunc: func() (int, gonvml.Return) { return 12040, gonvml.SUCCESS },
	}
	topo, err := Discover(t.Context(), nvmltest.Lib(lib), newPCIeBox().options()...)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(topo)
	if !bytes.Contains(b, []byte(`"gpus":[]`)) || !bytes.Contains(b, []byte(`"links":[]`)) {
		t.Errorf("JSON: got %s, want empty gpus and links", b)
	}
}

func TestSysfsBusID(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{"00000000:1B:00.0", "0000:1b:00.0", true},
		{"0000:07:00.0", "0000:07:00.0", true},
		{"00000001:C3:1f.7", "0001:c3:1f.7", true},
		{"07:00.0", "0000:07:00.0", true},
		{"", "", false},
		{"junk", "", false},
		{"0000:zz:00.0", "", false},
	} {
		got, ok := sysfsBusID(tc.in)
		if got != tc.want || ok != tc.ok {
			t.Errorf("sysfsBusID(%q): got %q, %v, want %q, %v", tc.in, got, ok, tc.want, tc.ok)
		}
	}
}

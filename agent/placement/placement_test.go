package placement

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/ddp-agent/ddp-agent/nvml"
)

func cpus(s string) nvml.CPUList {
	l, err := nvml.ParseCPUList(s)
	if err != nil {
		panic(err)
	}
	return l
}

// uuid is GPU i's UUID in the hand-built topologies: all share the prefix
// "GPU-1c9a7e0" (GPUs 0-9), so that a short prefix is ambiguous.
func uuid(i int) string { return fmt.Sprintf("GPU-1c9a7e%02d-5c3b-4a7e-9d1f-0123456789ab", i) }

// machine builds a topology: n GPUs linked by link, GPU i on NUMA node
// numa[i] (its CPU affinity that node's CPUs), the host's nodes given as
// CPU lists by id.
func machine(n int, link func(a, b int) nvml.Link, numa []int, nodes map[int]string) *nvml.Topology {
	t := &nvml.Topology{}
	for _, id := range slices.Sorted(maps.Keys(nodes)) {
		t.Host.NUMANodes = append(t.Host.NUMANodes, nvml.NUMANode{ID: id, CPUs: cpus(nodes[id])})
	}
	for i := range n {
		g := nvml.GPU{Index: i, UUID: uuid(i), NUMANode: numa[i], GPUNUMANode: -1, MIG: nvml.MIGDisabled, CPUAffinity: nvml.CPUList{}}
		if s, ok := nodes[numa[i]]; ok {
			g.CPUAffinity = cpus(s)
		}
		t.GPUs = append(t.GPUs, g)
		row := make([]nvml.Link, n)
		for j := range n {
			if i == j {
				row[j] = nvml.Link{PCIe: nvml.PathSelf}
			} else {
				row[j] = link(min(i, j), max(i, j))
			}
		}
		t.Links = append(t.Links, row)
	}
	return t
}

// dgxA100 is a DGX A100: every pair NV12 through the NVSwitches, PCIe PXB
// within the pairs (0,1) (2,3) (4,5) (6,7) and SYS otherwise; node n has
// CPUs 16n..16n+15 and their siblings 128 higher.
func dgxA100() *nvml.Topology {
	nodes := map[int]string{}
	for n := range 8 {
		nodes[n] = fmt.Sprintf("%d-%d,%d-%d", 16*n, 16*n+15, 128+16*n, 128+16*n+15)
	}
	t := machine(8, func(a, b int) nvml.Link {
		l := nvml.Link{NVLinks: 12, NVLinkVersion: "3.0", ViaNVSwitch: true, PCIe: nvml.PathSYS}
		if a/2 == b/2 {
			l.PCIe = nvml.PathPXB
		}
		return l
	}, []int{3, 3, 1, 1, 7, 7, 5, 5}, nodes)
	t.NVSwitch = true
	return t
}

// siblingsFS is a /sys whose CPU c (of n) shares its core with c+n/2.
func siblingsFS(n int) fstest.MapFS {
	fsys := fstest.MapFS{}
	for c := range n {
		lo := c % (n / 2)
		fsys[fmt.Sprintf("devices/system/cpu/cpu%d/topology/thread_siblings_list", c)] =
			&fstest.MapFile{Data: fmt.Appendf(nil, "%d,%d\n", lo, lo+n/2)}
	}
	return fsys
}

// pcieBox is a two-socket PCIe-only box: GPUs 0,1 behind one switch (PIX)
// on node 0 (CPUs 0-15,32-47), GPUs 2,3 likewise on node 1 (16-31,48-63),
// SYS across.
func pcieBox() *nvml.Topology {
	return machine(4, func(a, b int) nvml.Link {
		if a/2 == b/2 {
			return nvml.Link{PCIe: nvml.PathPIX}
		}
		return nvml.Link{PCIe: nvml.PathSYS}
	}, []int{0, 0, 1, 1}, map[int]string{0: "0-15,32-47", 1: "16-31,48-63"})
}

// bridged is a 4-GPU box with NVLink bridges between 0 and 2 and between
// 1 and 3 only; 0,1 and 2,3 share PCIe switches, SYS otherwise.
func bridged() *nvml.Topology {
	return machine(4, func(a, b int) nvml.Link {
		switch {
		case b-a == 2:
			return nvml.Link{NVLinks: 4, NVLinkVersion: "3.0", PCIe: nvml.PathSYS}
		case a/2 == b/2:
			return nvml.Link{PCIe: nvml.PathPIX}
		}
		return nvml.Link{PCIe: nvml.PathSYS}
	}, []int{0, 0, 1, 1}, map[int]string{0: "0-15", 1: "16-31"})
}

func mustNew(t *testing.T, in Input) *Plan {
	t.Helper()
	p, err := New(in)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// bindings is the workers' GPUs and bindings in one comparable string:
// "0:GPU0 48-63@3 ...", "@!" for strict memory, "-" for no CPUs.
func bindings(p *Plan) string {
	var s []string
	for _, w := range p.Workers {
		c := w.CPUs.String()
		if w.CPUs == nil {
			c = "-"
		}
		mem := ""
		switch {
		case w.MemNode >= 0 && w.StrictMem:
			mem = fmt.Sprintf("@!%d", w.MemNode)
		case w.MemNode >= 0:
			mem = fmt.Sprintf("@%d", w.MemNode)
		}
		s = append(s, fmt.Sprintf("%d:GPU%d %s%s", w.LocalRank, w.GPU, c, mem))
	}
	return strings.Join(s, " ")
}

func TestDGXA100(t *testing.T) {
	for _, tc := range []struct {
		name string
		mode Mode
		want string
	}{
		{"none", ModeNone, "0:GPU0 - 1:GPU1 - 2:GPU2 - 3:GPU3 - 4:GPU4 - 5:GPU5 - 6:GPU6 - 7:GPU7 -"},
		{"node", ModeNode, "0:GPU0 48-63,176-191@3 1:GPU1 48-63,176-191@3 2:GPU2 16-31,144-159@1 3:GPU3 16-31,144-159@1 " +
			"4:GPU4 112-127,240-255@7 5:GPU5 112-127,240-255@7 6:GPU6 80-95,208-223@5 7:GPU7 80-95,208-223@5"},
		{"exclusive", ModeExclusive, "0:GPU0 48-55,176-183@!3 1:GPU1 56-63,184-191@!3 2:GPU2 16-23,144-151@!1 3:GPU3 24-31,152-159@!1 " +
			"4:GPU4 112-119,240-247@!7 5:GPU5 120-127,248-255@!7 6:GPU6 80-87,208-215@!5 7:GPU7 88-95,216-223@!5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, Input{Topology: dgxA100(), NProc: 8, Mode: tc.mode, SysFS: siblingsFS(256)})
			if want := []int{0, 1, 2, 3, 4, 5, 6, 7}; !slices.Equal(p.Ring, want) {
				t.Errorf("ring: got %v, want %v", p.Ring, want)
			}
			if got := bindings(p); got != tc.want {
				t.Errorf("bindings:\ngot  %s\nwant %s", got, tc.want)
			}
			if len(p.Notes) != 0 {
				t.Errorf("notes: got %q, want none", p.Notes)
			}
			if got, want := p.String(), "ring 0,1,2,3,4,5,6,7 (NV12 all pairs)"; !strings.HasPrefix(got, want) {
				t.Errorf("String: got %q, want it to start with %q", got, want)
			}
		})
	}
}

func TestPCIeBox(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  Mode
		sysfs bool
		want  string
	}{
		{"node", ModeNode, false, "0:GPU0 0-15,32-47@0 1:GPU1 0-15,32-47@0 2:GPU2 16-31,48-63@1 3:GPU3 16-31,48-63@1"},
		{"exclusive with siblings", ModeExclusive, true,
			"0:GPU0 0-7,32-39@!0 1:GPU1 8-15,40-47@!0 2:GPU2 16-23,48-55@!1 3:GPU3 24-31,56-63@!1"},
		// Without thread siblings every CPU is a core of its own.
		{"exclusive without siblings", ModeExclusive, false, "0:GPU0 0-15@!0 1:GPU1 32-47@!0 2:GPU2 16-31@!1 3:GPU3 48-63@!1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := Input{Topology: pcieBox(), NProc: 4, Mode: tc.mode}
			if tc.sysfs {
				in.SysFS = siblingsFS(64)
			}
			p := mustNew(t, in)
			if want := []int{0, 1, 2, 3}; !slices.Equal(p.Ring, want) {
				t.Errorf("ring: got %v, want %v", p.Ring, want)
			}
			if got := bindings(p); got != tc.want {
				t.Errorf("bindings:\ngot  %s\nwant %s", got, tc.want)
			}
			if got, want := p.String(), "ring 0,1,2,3 (hops PIX SYS PIX SYS); numa-binding "+string(tc.mode)+": 0:"; !strings.HasPrefix(got, want) {
				t.Errorf("String: got %q, want it to start with %q", got, want)
			}
		})
	}
}

func TestBridgedRing(t *testing.T) {
	p := mustNew(t, Input{Topology: bridged(), NProc: 4})
	if want := []int{0, 1, 3, 2}; !slices.Equal(p.Ring, want) {
		t.Errorf("ring: got %v, want %v", p.Ring, want)
	}
	// Whatever the order, each bridged pair must be adjacent (last→first
	// included).
	for _, pair := range [][2]int{{0, 2}, {1, 3}} {
		i, j := slices.Index(p.Ring, pair[0]), slices.Index(p.Ring, pair[1])
		if d := (i - j + 4) % 4; d != 1 && d != 3 {
			t.Errorf("ring %v: GPUs %d and %d not adjacent", p.Ring, pair[0], pair[1])
		}
	}
	if got, want := p.String(), "ring 0,1,3,2 (hops PIX NV4 PIX NV4); no binding"; got != want {
		t.Errorf("String: got %q, want %q", got, want)
	}
}

func TestVisible(t *testing.T) {
	for _, tc := range []struct {
		name    string
		topo    func() *nvml.Topology
		visible string
		ring    []int
		env     string // CUDA_VISIBLE_DEVICES emitted
		order   bool   // CUDA_DEVICE_ORDER=PCI_BUS_ID emitted
	}{
		{"unset", pcieBox, "", []int{0, 1, 2, 3}, "0,1,2,3", true},
		{"indexes reordered", pcieBox, "3,1", []int{1, 3}, "1,3", true},
		{"UUIDs", pcieBox, uuid(3) + "," + uuid(1), []int{1, 3}, uuid(1) + "," + uuid(3), false},
		{"UUID prefixes", pcieBox, "GPU-1c9a7e03,GPU-1c9a7e01", []int{1, 3}, "GPU-1c9a7e01,GPU-1c9a7e03", false},
		{"mixed, blanks", pcieBox, " GPU-1c9a7e03 , 1", []int{1, 3}, "1,GPU-1c9a7e03", true},
		{"spelling kept through the ring", bridged, "GPU-1c9a7e00,1,GPU-1c9a7e02,3", []int{0, 1, 3, 2},
			"GPU-1c9a7e00,1,3,GPU-1c9a7e02", true},
		{"one", bridged, "2", []int{2}, "2", true},
		{"ends at -1, as in CUDA", pcieBox, "2,0,-1,3", []int{0, 2}, "0,2", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, Input{Topology: tc.topo(), NProc: len(tc.ring), Visible: tc.visible, VisibleSet: tc.name != "unset"})
			if !slices.Equal(p.Ring, tc.ring) {
				t.Errorf("ring: got %v, want %v", p.Ring, tc.ring)
			}
			for i, w := range p.Workers {
				want := map[string]string{"CUDA_VISIBLE_DEVICES": tc.env, "DDP_AGENT_GPU": uuid(tc.ring[i])}
				if tc.order {
					want["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
				}
				if got := p.Env(i); !maps.Equal(got, want) {
					t.Errorf("Env(%d): got %v, want %v", i, got, want)
				}
				if w.GPU != tc.ring[i] || w.UUID != uuid(tc.ring[i]) {
					t.Errorf("worker %d: got GPU %d %s, want %d %s", i, w.GPU, w.UUID, tc.ring[i], uuid(tc.ring[i]))
				}
			}
		})
	}
}

func TestVisibleErrors(t *testing.T) {
	for _, tc := range []struct{ visible, want string }{
		{"4", `"4" names no GPU`},
		{"0,x", `"x" names no GPU`},
		{"0,,1", `"" names no GPU`},
		{"GPU-ffff", `"GPU-ffff" names no GPU`},
		{"GPU-1c9a7e0", "ambiguous"},
		{"1,1", "both name GPU 1"},
		{"1," + uuid(1), "both name GPU 1"},
	} {
		t.Run(tc.visible, func(t *testing.T) {
			_, err := New(Input{Topology: pcieBox(), NProc: 1, Visible: tc.visible, VisibleSet: true})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestNoGPUs(t *testing.T) {
	empty := &nvml.Topology{Host: nvml.HostInfo{NUMANodes: []nvml.NUMANode{{ID: 0, CPUs: cpus("0-7")}}}}
	for _, tc := range []struct {
		name  string
		in    Input
		notes int
	}{
		{"no NVML", Input{NProc: 3, Mode: ModeExclusive, Visible: "0", VisibleSet: true}, 0},
		{"NVML without GPUs", Input{Topology: empty, NProc: 3, Mode: ModeNode}, 0},
		{"none visible", Input{Topology: pcieBox(), NProc: 3, Mode: ModeNode, Visible: "", VisibleSet: true}, 1},
		// CUDA stops at a negative index: -1 hides every GPU.
		{"hidden by -1", Input{Topology: pcieBox(), NProc: 3, Mode: ModeNode, Visible: "-1", VisibleSet: true}, 1},
		{"Slurm's NoDevFiles", Input{Topology: pcieBox(), NProc: 3, Mode: ModeNode, Visible: "NoDevFiles", VisibleSet: true}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, tc.in)
			if len(p.Ring) != 0 {
				t.Errorf("ring: got %v, want none", p.Ring)
			}
			if got, want := bindings(p), "0:GPU-1 - 1:GPU-1 - 2:GPU-1 -"; got != want {
				t.Errorf("bindings: got %s, want %s", got, want)
			}
			for i := range 3 {
				if env := p.Env(i); len(env) != 0 || p.Workers[i].Args() != nil {
					t.Errorf("worker %d: got env %v and args %q, want none", i, env, p.Workers[i].Args())
				}
			}
			if len(p.Notes) != tc.notes {
				t.Errorf("notes: got %q, want %d", p.Notes, tc.notes)
			}
			if got, want := p.String(), "no GPUs; no binding"; got != want {
				t.Errorf("String: got %q, want %q", got, want)
			}
		})
	}
}

func TestMoreWorkersThanGPUs(t *testing.T) {
	p := mustNew(t, Input{Topology: pcieBox(), NProc: 6, Mode: ModeNode})
	want := "0:GPU0 0-15,32-47@0 1:GPU1 0-15,32-47@0 2:GPU2 16-31,48-63@1 3:GPU3 16-31,48-63@1 4:GPU-1 - 5:GPU-1 -"
	if got := bindings(p); got != want {
		t.Errorf("bindings:\ngot  %s\nwant %s", got, want)
	}
	if len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "local ranks 4-5 have no GPU") {
		t.Errorf("notes: got %q, want one about local ranks 4-5", p.Notes)
	}
	if got, want := p.Env(5), map[string]string{"CUDA_VISIBLE_DEVICES": "0,1,2,3", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}; !maps.Equal(got, want) {
		t.Errorf("Env(5): got %v, want %v", got, want)
	}
	if got := p.String(); !strings.HasSuffix(got, " 4:- 5:-") {
		t.Errorf("String: got %q, want the unbound workers as 4:- 5:-", got)
	}
}

func TestAllowed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		mode    Mode
		allowed string
		want    string
		notes   int
	}{
		{"node, part of each node", ModeNode, "0-7,16-23", "0:GPU0 0-7@0 1:GPU1 0-7@0 2:GPU2 16-23@1 3:GPU3 16-23@1", 0},
		{"node, one node only", ModeNode, "0-15,32-47", "0:GPU0 0-15,32-47@0 1:GPU1 0-15,32-47@0 2:GPU2 - 3:GPU3 -", 2},
		// The allowed cores of node 0 are shared out; node 1 has none.
		{"exclusive", ModeExclusive, "0-3,32-35", "0:GPU0 0-1,32-33@!0 1:GPU1 2-3,34-35@!0 2:GPU2 - 3:GPU3 -", 2},
		// One allowed core for two workers: the second goes unbound.
		{"exclusive, one core", ModeExclusive, "5,37,16-31,48-63",
			"0:GPU0 5,37@!0 1:GPU1 - 2:GPU2 16-23,48-55@!1 3:GPU3 24-31,56-63@!1", 1},
		// Half a core: the thread the agent may use.
		{"exclusive, one thread", ModeExclusive, "0-15,37,16-31,48-63",
			"0:GPU0 0-7,37@!0 1:GPU1 8-15@!0 2:GPU2 16-23,48-55@!1 3:GPU3 24-31,56-63@!1", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, Input{Topology: pcieBox(), NProc: 4, Mode: tc.mode, Allowed: cpus(tc.allowed), SysFS: siblingsFS(64)})
			if got := bindings(p); got != tc.want {
				t.Errorf("bindings:\ngot  %s\nwant %s", got, tc.want)
			}
			if len(p.Notes) != tc.notes {
				t.Errorf("notes: got %q, want %d", p.Notes, tc.notes)
			}
			for _, w := range p.Workers {
				if w.CPUs == nil && w.Args() != nil {
					t.Errorf("worker %d unbound: got args %q, want none", w.LocalRank, w.Args())
				}
			}
		})
	}
}

// TestAllowedMems: a cpuset whose mems leave out a GPU's node keeps the
// CPUs bound and drops the memory policy (set_mempolicy would refuse it).
func TestAllowedMems(t *testing.T) {
	p := mustNew(t, Input{Topology: pcieBox(), NProc: 4, Mode: ModeExclusive, AllowedMems: cpus("0"), SysFS: siblingsFS(64)})
	if got, want := bindings(p), "0:GPU0 0-7,32-39@!0 1:GPU1 8-15,40-47@!0 2:GPU2 16-23,48-55 3:GPU3 24-31,56-63"; got != want {
		t.Errorf("bindings:\ngot  %s\nwant %s", got, want)
	}
	if len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "local ranks 2,3") {
		t.Errorf("notes: got %q, want one naming local ranks 2,3", p.Notes)
	}
	for _, w := range p.Workers[2:] {
		if slices.Contains(w.Args(), "--mem") {
			t.Errorf("worker %d: args %q still set a memory policy", w.LocalRank, w.Args())
		}
	}
}

func TestExclusiveTooFewCores(t *testing.T) {
	topo := pcieBox()
	topo.Host.NUMANodes[1].CPUs = cpus("16,48")
	_, err := New(Input{Topology: topo, NProc: 4, Mode: ModeExclusive, SysFS: siblingsFS(64)})
	if want := "NUMA node 1 has 1 physical cores for 2 workers"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("got error %v, want one containing %q", err, want)
	}
	// Node mode shares the node: no error.
	if _, err := New(Input{Topology: topo, NProc: 4, Mode: ModeNode, SysFS: siblingsFS(64)}); err != nil {
		t.Errorf("node mode: got %v, want no error", err)
	}
}

func TestUnknownNUMANode(t *testing.T) {
	topo := pcieBox()
	for i := range topo.GPUs {
		topo.GPUs[i].NUMANode = -1
	}
	topo.GPUs[3].CPUAffinity = nvml.CPUList{}
	for _, tc := range []struct {
		mode Mode
		want string
	}{
		{ModeNode, "0:GPU0 0-15,32-47 1:GPU1 0-15,32-47 2:GPU2 16-31,48-63 3:GPU3 -"},
		// Without a node, the GPUs that share a CPU affinity share it out, and
		// memory is left alone.
		{ModeExclusive, "0:GPU0 0-7,32-39 1:GPU1 8-15,40-47 2:GPU2 16-31,48-63 3:GPU3 -"},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			p := mustNew(t, Input{Topology: topo, NProc: 4, Mode: tc.mode, SysFS: siblingsFS(64)})
			if got := bindings(p); got != tc.want {
				t.Errorf("bindings:\ngot  %s\nwant %s", got, tc.want)
			}
			if len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "GPU 3 are unknown") {
				t.Errorf("notes: got %q, want one about GPU 3", p.Notes)
			}
		})
	}
}

func TestMIG(t *testing.T) {
	topo := pcieBox()
	topo.GPUs[2].MIG = nvml.MIGEnabled
	p := mustNew(t, Input{Topology: topo, NProc: 2, Mode: ModeExclusive, Visible: "3,2", VisibleSet: true})
	if want := []int{3, 2}; !slices.Equal(p.Ring, want) {
		t.Errorf("ring: got %v, want %v (as given)", p.Ring, want)
	}
	if got, want := bindings(p), "0:GPU-1 - 1:GPU-1 -"; got != want {
		t.Errorf("bindings: got %s, want %s", got, want)
	}
	if env := p.Env(0); len(env) != 0 {
		t.Errorf("Env: got %v, want none", env)
	}
	if len(p.Notes) != 1 || !strings.Contains(p.Notes[0], "MIG") {
		t.Errorf("notes: got %q, want one about MIG", p.Notes)
	}

	// MIG instances named in CUDA_VISIBLE_DEVICES are no error.
	p = mustNew(t, Input{Topology: topo, NProc: 1, Mode: ModeNode, Visible: "MIG-5c3b1c9a-4a7e-9d1f-0123456789ab", VisibleSet: true})
	if len(p.Ring) != 0 || len(p.Env(0)) != 0 || len(p.Notes) != 1 {
		t.Errorf("MIG entry: got ring %v, env %v, notes %q; want none, none, one note", p.Ring, p.Env(0), p.Notes)
	}
}

func TestNewErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   Input
		want string
	}{
		{"no workers", Input{Topology: pcieBox()}, "want at least one"},
		{"bad mode", Input{Topology: pcieBox(), NProc: 1, Mode: "socket"}, `"socket": want one of none, node, exclusive`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got error %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestParseMode(t *testing.T) {
	for _, s := range []string{"none", "node", "exclusive"} {
		if m, err := ParseMode(s); err != nil || string(m) != s {
			t.Errorf("ParseMode(%q): got %q, %v; want %q", s, m, err, s)
		}
	}
	for _, s := range []string{"", "Node", "socket"} {
		if _, err := ParseMode(s); err == nil || !strings.Contains(err.Error(), "none, node, exclusive") {
			t.Errorf("ParseMode(%q): got error %v, want one naming the valid values", s, err)
		}
	}
}

func TestArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		w    Worker
		want []string
	}{
		{"unbound", Worker{GPU: 0, MemNode: -1}, nil},
		{"node", Worker{CPUs: cpus("0-15,128-143"), MemNode: 3}, []string{"__bind", "--cpus", "0-15,128-143", "--mem", "3", "--"}},
		{"exclusive", Worker{CPUs: cpus("0-7"), MemNode: 0, StrictMem: true}, []string{"__bind", "--cpus", "0-7", "--mem", "0", "--strict", "--"}},
		{"CPUs only", Worker{CPUs: cpus("4"), MemNode: -1}, []string{"__bind", "--cpus", "4", "--"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.w.Args()
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if got == nil {
				return
			}
			b, err := parseBind(append(got[1:], "python", "train.py"))
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(b.cpus, tc.w.CPUs) || b.mem != tc.w.MemNode || b.strict != tc.w.StrictMem || !slices.Equal(b.argv, []string{"python", "train.py"}) {
				t.Errorf("parsed back: got %+v, want %+v", b, tc.w)
			}
		})
	}
}

// bruteRing is the best ring by definition: every order starting at 0,
// the first of the best in lexicographic order.
func bruteRing(w [][]int) ([]int, ringScore) {
	n := len(w)
	var best []int
	bestScore := ringScore{min: -1}
	var perm func(ring []int, rest []int)
	perm = func(ring, rest []int) {
		if len(rest) == 0 {
			if s := evalRing(w, ring); s.better(bestScore) {
				best, bestScore = slices.Clone(ring), s
			}
			return
		}
		for i, v := range rest {
			perm(append(ring, v), append(slices.Clone(rest[:i]), rest[i+1:]...))
		}
	}
	rest := make([]int, n-1)
	for i := range rest {
		rest[i] = i + 1
	}
	perm([]int{0}, rest)
	return best, bestScore
}

// randomScores is a symmetric matrix of link scores drawn from few values,
// so that ties abound.
func randomScores(r *rand.Rand, n int) [][]int {
	values := []int{1, 2, 5, 8 + 1, 8*4 + 5, 8*12 + 4}
	w := make([][]int, n)
	for i := range w {
		w[i] = make([]int, n)
	}
	for i := range n {
		for j := i + 1; j < n; j++ {
			w[i][j] = values[r.IntN(len(values))]
			w[j][i] = w[i][j]
		}
	}
	return w
}

func TestExactRing(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for n := 4; n <= 8; n++ {
		for range 30 {
			w := randomScores(r, n)
			want, _ := bruteRing(w)
			if got := ringOrder(w); !slices.Equal(got, want) {
				t.Fatalf("n=%d %v: got %v (%v), want %v (%v)", n, w, got, evalRing(w, got), want, evalRing(w, want))
			}
		}
	}
}

// TestHeuristicRing checks the heuristic on 16 GPUs where the best ring is
// known: two NVSwitch boards (the even GPUs and the odd ones), PCIe SYS
// between them, so the best ring crosses once each way.
func TestHeuristicRing(t *testing.T) {
	topo := machine(16, func(a, b int) nvml.Link {
		if a%2 == b%2 {
			return nvml.Link{NVLinks: 12, ViaNVSwitch: true, PCIe: nvml.PathSYS}
		}
		return nvml.Link{PCIe: nvml.PathSYS}
	}, slices.Repeat([]int{0}, 16), map[int]string{0: "0-63"})
	gpus := make([]int, 16)
	for i := range gpus {
		gpus[i] = i
	}
	w := linkScores(topo, gpus)
	got := ringOrder(w)
	if s, want := evalRing(w, got), (ringScore{min: 1, atMin: 2, sum: 14*97 + 2*1}); s != want {
		t.Errorf("ring %v: got score %+v, want %+v", got, s, want)
	}
	if got[0] != 0 || got[1] > got[15] {
		t.Errorf("ring %v: want it to start at 0, turned to its smaller neighbour", got)
	}
	// All alike: identity.
	same := linkScores(machine(16, func(a, b int) nvml.Link { return nvml.Link{NVLinks: 18} },
		slices.Repeat([]int{-1}, 16), nil), gpus)
	if got := ringOrder(same); !slices.Equal(got, gpus) {
		t.Errorf("identical links: got %v, want %v", got, gpus)
	}
}

// TestRingQuality compares the heuristic with the exact answer where the
// latter can be had: it need not be optimal, but must come close.
func TestRingQuality(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	optimal := 0
	for range 40 {
		w := randomScores(r, 9)
		_, want := bruteRing(w)
		got := evalRing(w, heuristicRing(w))
		if got.min < want.min {
			t.Errorf("heuristic ring %+v, the best %+v", got, want)
		}
		if got == want {
			optimal++
		}
	}
	t.Logf("optimal: %d of 40", optimal)
	if optimal < 30 {
		t.Errorf("heuristic optimal in %d of 40 random 9-GPU rings, want at least 30", optimal)
	}
}

func TestRingTime(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{10, 16} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			links := randomScores(r, n)
			topo := machine(n, func(a, b int) nvml.Link {
				return nvml.Link{NVLinks: links[a][b] / 8, PCIe: []nvml.PathClass{"", nvml.PathSYS, nvml.PathNODE, nvml.PathPHB, nvml.PathPXB, nvml.PathPIX}[links[a][b]%8]}
			}, slices.Repeat([]int{0}, n), map[int]string{0: "0-63"})
			worst := time.Duration(0)
			for range 5 {
				start := time.Now()
				mustNew(t, Input{Topology: topo, NProc: n, Mode: ModeExclusive})
				worst = max(worst, time.Since(start))
			}
			limit := 50 * time.Millisecond
			if raceEnabled {
				limit *= 10 // the race detector slows this code some tenfold
			}
			if worst > limit {
				t.Errorf("New with %d GPUs took %v, want under %v", n, worst, limit)
			}
			t.Logf("%d GPUs: %v", n, worst)
		})
	}
}

func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ in, want []int }{
		{[]int{2, 3, 0, 1}, []int{0, 1, 2, 3}},
		{[]int{2, 1, 0, 3}, []int{0, 1, 2, 3}},
		{[]int{1, 0}, []int{0, 1}},
		{[]int{5, 7, 9, 6}, []int{5, 6, 9, 7}},
	} {
		if got := canonical(tc.in); !slices.Equal(got, tc.want) {
			t.Errorf("canonical(%v): got %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestMoveStretch(t *testing.T) {
	ring := []int{0, 1, 2, 3, 4, 5}
	for _, tc := range []struct {
		i, length, k int
		turned       bool
		want         []int
	}{
		{1, 2, 3, false, []int{0, 3, 4, 1, 2, 5}},
		{1, 2, 3, true, []int{0, 3, 4, 2, 1, 5}},
		{4, 2, 1, false, []int{0, 4, 5, 1, 2, 3}},
		{2, 1, 5, false, []int{0, 1, 3, 4, 5, 2}},
	} {
		got := make([]int, len(ring))
		moveStretch(got, ring, tc.i, tc.length, tc.k, tc.turned)
		if !slices.Equal(got, tc.want) {
			t.Errorf("moveStretch(%d, %d, %d, %v): got %v, want %v", tc.i, tc.length, tc.k, tc.turned, got, tc.want)
		}
	}
}

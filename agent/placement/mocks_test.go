package placement

import (
	"slices"
	"testing"

	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// TestDiscoveredMachines plans on what nvml.Discover reads from go-nvml's
// mocks (nvmltest), not on hand-built topologies: the DGX A100 and the
// two-socket PCIe box (PIX on socket 0, PHB on socket 1, SYS between).
func TestDiscoveredMachines(t *testing.T) {
	dgx, err := nvml.Discover(t.Context(), nvmltest.Lib(nvmltest.DGXA100(true)), nvml.WithSysFS(nvmltest.DGXSysFS()))
	if err != nil {
		t.Fatal(err)
	}
	box := nvmltest.NewPCIeBox()
	pcie, err := nvml.Discover(t.Context(), nvmltest.Lib(box.Lib), nvml.WithSysFS(box.SysFS()))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		topo   *nvml.Topology
		nproc  int
		mode   Mode
		ring   []int
		want   string
		prefix string
	}{
		{"dgx node", dgx, 8, ModeNode, []int{0, 1, 2, 3, 4, 5, 6, 7},
			"0:GPU0 48-63,176-191@3 1:GPU1 48-63,176-191@3 2:GPU2 16-31,144-159@1 3:GPU3 16-31,144-159@1 " +
				"4:GPU4 112-127,240-255@7 5:GPU5 112-127,240-255@7 6:GPU6 80-95,208-223@5 7:GPU7 80-95,208-223@5",
			"ring 0,1,2,3,4,5,6,7 (NV12 all pairs)"},
		{"pcie node", pcie, 4, ModeNode, []int{0, 1, 2, 3},
			"0:GPU0 0-15,32-47@0 1:GPU1 0-15,32-47@0 2:GPU2 16-31,48-63@1 3:GPU3 16-31,48-63@1",
			"ring 0,1,2,3 (hops PIX SYS PHB SYS)"},
		{"pcie exclusive", pcie, 4, ModeExclusive, []int{0, 1, 2, 3},
			"0:GPU0 0-15@!0 1:GPU1 32-47@!0 2:GPU2 16-31@!1 3:GPU3 48-63@!1", "ring 0,1,2,3"},
		// Two workers take the best pair: the one behind a PCIe switch.
		{"pcie two workers", pcie, 2, ModeNode, []int{0, 1, 2, 3},
			"0:GPU0 0-15,32-47@0 1:GPU1 0-15,32-47@0", "ring 0,1,2,3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := mustNew(t, Input{Topology: tc.topo, NProc: tc.nproc, Mode: tc.mode})
			if !slices.Equal(p.Ring, tc.ring) {
				t.Errorf("ring: got %v, want %v", p.Ring, tc.ring)
			}
			if got := bindings(p); got != tc.want {
				t.Errorf("bindings:\ngot  %s\nwant %s", got, tc.want)
			}
			if got := p.String(); len(got) < len(tc.prefix) || got[:len(tc.prefix)] != tc.prefix {
				t.Errorf("String: got %q, want it to start with %q", got, tc.prefix)
			}
			for i, w := range p.Workers {
				if w.UUID != tc.topo.GPUs[tc.ring[i]].UUID {
					t.Errorf("worker %d: UUID %s, want GPU %d's", i, w.UUID, tc.ring[i])
				}
			}
		})
	}
}

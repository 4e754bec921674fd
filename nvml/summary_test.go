package nvml

import (
	"testing"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

func TestSummary(t *testing.T) {
	dgx, err := Discover(t.Context(), nvmltest.Lib(dgxServer(true)), dgxOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	box := newPCIeBox()
	pcie, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
	if err != nil {
		t.Fatal(err)
	}
	one := &Topology{GPUs: pcie.GPUs[:1], Links: [][]Link{{pcie.Links[0][0]}}, Driver: "535.183.01"}
	mixed := &Topology{GPUs: []GPU{{Name: "A"}, {Name: "B"}, {Name: "A"}}, NVSwitch: false, Links: [][]Link{
		{{PCIe: PathSelf}, {NVLinks: 4, PCIe: PathPIX}, {PCIe: PathSYS}},
		{{NVLinks: 4, PCIe: PathPIX}, {PCIe: PathSelf}, {PCIe: PathSYS}},
		{{PCIe: PathSYS}, {PCIe: PathSYS}, {PCIe: PathSelf}},
	}}
	for _, tc := range []struct {
		t    *Topology
		want string
	}{
		{dgx, "8× " + dgx.GPUs[0].Name + ", NVSwitch (NV12), driver " + dgx.Driver + ", CUDA " + dgx.CUDA},
		{pcie, "4× NVIDIA A40, PCIe only, up to SYS, driver 535.183.01, CUDA 12.2"},
		{one, "1× NVIDIA A40, 1 GPU, driver 535.183.01"},
		{mixed, "2× A, 1× B, NVLink between 1 of 3 pairs, PCIe up to SYS"},
		{&Topology{}, "no GPUs"},
		{nil, "no GPUs"},
	} {
		if got := tc.t.Summary(); got != tc.want {
			t.Errorf("got %q, want %q", got, tc.want)
		}
	}
}

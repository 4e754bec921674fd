package nvml

import (
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestPathClass(t *testing.T) {
	for _, tc := range []struct {
		lvl  gonvml.GpuTopologyLevel
		want PathClass
	}{
		{gonvml.TOPOLOGY_INTERNAL, PathPIX}, {gonvml.TOPOLOGY_SINGLE, PathPIX}, {gonvml.TOPOLOGY_MULTIPLE, PathPXB},
		{gonvml.TOPOLOGY_HOSTBRIDGE, PathPHB}, {gonvml.TOPOLOGY_NODE, PathNODE}, {gonvml.TOPOLOGY_SYSTEM, PathSYS},
		{gonvml.GpuTopologyLevel(60), ""},
	} {
		if got := pathClass(tc.lvl); got != tc.want {
			t.Errorf("pathClass(%d): got %q, want %q", tc.lvl, got, tc.want)
		}
	}
}

package launch

import (
	"errors"
	"strings"
	"testing"
)

func TestDefaultNProcLimit(t *testing.T) {
	for _, tc := range []struct{ cpus, gpus, want int }{
		{2, 0, 32},    // the floor: a small CI runner
		{16, 0, 64},   // 4 per CPU
		{128, 8, 512}, // the CPUs win
		{4, 72, 288},  // the GPUs win
		{0, 0, 32},
	} {
		if got := DefaultNProcLimit(tc.cpus, tc.gpus); got != tc.want {
			t.Errorf("DefaultNProcLimit(%d, %d) = %d, want %d", tc.cpus, tc.gpus, got, tc.want)
		}
	}
}

// TestNProcLimit: --nproc-per-node is checked against the bound after
// gpu, cpu and auto are resolved, and --max-nproc-per-node moves it.
func TestNProcLimit(t *testing.T) {
	gpus := func(n int) Host {
		return Host{CPUs: 2, GPUs: func() (int, error) { return n, nil }}
	}
	noGPU := Host{CPUs: 2, GPUs: func() (int, error) { return 0, errors.New("no driver") }}
	tests := []struct {
		name    string
		args    string
		host    Host
		want    int    // workers, when accepted
		wantErr string // else the usage error holds this
	}{
		{"at the floor", "--nproc-per-node 32 x.py", noGPU, 32, ""},
		{"absurd", "--nproc-per-node 100000 x.py", noGPU, 0, "--nproc-per-node 100000 (100000 workers) is above this node's limit of 32 (4 per CPU or GPU: 2 CPUs, 0 GPUs; at least 32); if you mean it, raise the limit with --max-nproc-per-node 100000"},
		{"GPUs raise it", "--nproc-per-node 40 x.py", gpus(10), 40, ""},
		{"gpu resolved first", "--nproc-per-node gpu x.py", gpus(100), 100, ""},
		{"override", "--max-nproc-per-node 2000 --nproc-per-node 1500 x.py", noGPU, 1500, ""},
		{"override, underscores", "--max_nproc_per_node=2000 --nproc_per_node=1500 x.py", noGPU, 1500, ""},
		{"override is a bound too", "--max-nproc-per-node 4 --nproc-per-node 8 x.py", noGPU, 0, "--nproc-per-node 8 (8 workers) is above --max-nproc-per-node 4"},
		{"override below gpu", "--max-nproc-per-node 4 --nproc-per-node gpu x.py", gpus(8), 0, "--nproc-per-node gpu (8 workers) is above --max-nproc-per-node 4"},
		{"bad override", "--max-nproc-per-node 0 x.py", noGPU, 0, "--max-nproc-per-node must be an integer >= 1"},
		{"--max is still --max-restarts", "--max 3 --nproc-per-node 2 x.py", noGPU, 2, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(strings.Fields(tc.args), noEnv, tc.host)
			if tc.wantErr != "" {
				var ue *UsageError
				if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("got %v, want a usage error with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || c.NProcPerNode != tc.want {
				t.Fatalf("got %+v, %v; want %d workers", c, err, tc.want)
			}
		})
	}
	c, err := Parse([]string{"--nproc-per-node", "40", "x.py"}, func(k string) string {
		if k == "PET_MAX_NPROC_PER_NODE" {
			return "64"
		}
		return ""
	}, noGPU)
	if err != nil || c.NProcLimit != 64 {
		t.Errorf("PET_MAX_NPROC_PER_NODE=64: got %+v, %v", c, err)
	}
}

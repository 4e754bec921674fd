package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/placement"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// GPU placement through the real binary. This machine has no NVIDIA
// driver: the CPU-only path runs as it is, and the GPU paths run on saved
// topologies (DDP_AGENT_TOPOLOGY): go-nvml's DGX A100 mock as `ddp-agent
// topo --json` would print it, and a two-GPU machine made to fit this
// host's CPUs, so the NUMA binding is applied by the kernel and checked
// in /proc.

type placed struct {
	Env       map[string]string `json:"env"`
	CPUs      string            `json:"cpus"`
	MemPolicy string            `json:"mempolicy"`
}

func readPlaced(t *testing.T, r *agentRun, n int) []placed {
	t.Helper()
	out := make([]placed, n)
	for rank := range n {
		b, err := os.ReadFile(filepath.Join(r.out, fmt.Sprintf("place_%d.json", rank)))
		if err != nil {
			t.Fatalf("rank %d wrote nothing: %v\n%s", rank, err, r.logs())
		}
		if err := json.Unmarshal(b, &out[rank]); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

func noDriver(t *testing.T) {
	t.Helper()
	if lib, err := nvml.Open(); err == nil {
		lib.Shutdown()
		t.Skip("this machine has an NVIDIA driver")
	}
}

func saveTopology(t *testing.T, topo *nvml.Topology) string {
	t.Helper()
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "topo.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCPUOnlyNode: no driver, one clear line, and the job runs as before;
// --nproc-per-node gpu is refused; a binding asked for is a warning.
func TestCPUOnlyNode(t *testing.T) {
	budget(t, 10*time.Second)
	noDriver(t)
	r := startAgent(t, nil, "--nproc-per-node", "2", "--numa-binding", "exclusive", "place.py")
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	lines := regexp.MustCompile(`(?m)^.*no NVIDIA GPU \(libnvidia-ml\.so\.1[^\n]*\): CPU-only node[^\n]*$`).FindAllString(r.stderr.String(), -1)
	if len(lines) != 1 {
		t.Errorf("want one line saying the node is CPU-only, got %q\n%s", lines, r.logs())
	}
	if !strings.Contains(r.stderr.String(), "without GPUs the workers are not bound") {
		t.Errorf("no warning about --numa-binding exclusive without GPUs\n%s", r.logs())
	}
	for rank, p := range readPlaced(t, r, 2) {
		if _, ok := p.Env["DDP_AGENT_GPU"]; ok {
			t.Errorf("rank %d: DDP_AGENT_GPU set on a CPU-only node", rank)
		}
		if p.Env["CUDA_VISIBLE_DEVICES"] != os.Getenv("CUDA_VISIBLE_DEVICES") || p.MemPolicy != "default" {
			t.Errorf("rank %d: CUDA_VISIBLE_DEVICES %q, memory policy %q: want the agent's own and default", rank, p.Env["CUDA_VISIBLE_DEVICES"], p.MemPolicy)
		}
	}

	r = startAgent(t, nil, "--nproc-per-node", "gpu", "place.py")
	if code := r.wait(10 * time.Second); code != 2 || !strings.Contains(r.stderr.String(), "--nproc-per-node gpu: no GPU found (libnvidia-ml.so.1") {
		t.Errorf("--nproc-per-node gpu without GPUs: exit %d, want 2 and why\n%s", code, r.logs())
	}
}

// TestDGXPlacement: on a DGX A100's topology, --nproc-per-node gpu starts
// 8 workers; each sees every GPU in ring order with CUDA's order pinned to
// NVML's, and its own GPU's UUID; CUDA_VISIBLE_DEVICES narrows the set;
// `ddp-agent status` shows the node's GPUs. This host has none of the
// DGX's CPUs, so binding is skipped with a warning, not an error.
func TestDGXPlacement(t *testing.T) {
	budgetAlongside(t, 10*time.Second)
	topo, err := nvml.Discover(t.Context(), nvmltest.Lib(nvmltest.DGXA100(true)), nvml.WithSysFS(nvmltest.DGXSysFS()))
	if err != nil {
		t.Fatal(err)
	}
	saved := saveTopology(t, topo)
	port := freePort(t)
	ep := fmt.Sprintf("127.0.0.1:%d", port)
	r := startAgent(t, []string{"DDP_AGENT_TOPOLOGY=" + saved}, "--nproc-per-node", "gpu", "--rdzv-backend", "c10d",
		"--rdzv-endpoint", ep, "--rdzv-id", "dgx", "place.py", "--hold")
	waitFor(t, 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(r.out, "place_7.json"))
		return err == nil
	}, r.logs)
	st := agentOutput(t, "status", "--rdzv-endpoint", ep, "--json")
	var status struct {
		Nodes []struct {
			Entry struct {
				GPUs struct {
					Summary string `json:"summary"`
					Binding string `json:"numa_binding"`
					Ring    []int  `json:"ring"`
					Workers []struct {
						UUID string `json:"uuid"`
					} `json:"workers"`
				} `json:"gpus"`
			} `json:"entry"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(st), &status); err != nil || len(status.Nodes) != 1 {
		t.Fatalf("status --json: %v\n%s", err, st)
	}
	g := status.Nodes[0].Entry.GPUs
	if !strings.HasPrefix(g.Summary, "8× ") || !strings.Contains(g.Summary, "NVSwitch (NV12)") || g.Binding != "node" || len(g.Ring) != 8 || len(g.Workers) != 8 || g.Workers[7].UUID != topo.GPUs[7].UUID {
		t.Errorf("status: gpus %+v, want the DGX, node binding, 8 workers", g)
	}
	if text := agentOutput(t, "status", "--rdzv-endpoint", ep); !strings.Contains(text, "GPUS\n") || !strings.Contains(text, "CUDA order 0,1,2,3,4,5,6,7") {
		t.Errorf("status: no GPU line\n%s", text)
	}
	os.WriteFile(filepath.Join(r.out, "release"), nil, 0o644)
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	for rank, p := range readPlaced(t, r, 8) {
		if p.Env["CUDA_VISIBLE_DEVICES"] != "0,1,2,3,4,5,6,7" || p.Env["CUDA_DEVICE_ORDER"] != "PCI_BUS_ID" || p.Env["DDP_AGENT_GPU"] != topo.GPUs[rank].UUID {
			t.Errorf("rank %d: CUDA_VISIBLE_DEVICES %q CUDA_DEVICE_ORDER %q DDP_AGENT_GPU %q", rank,
				p.Env["CUDA_VISIBLE_DEVICES"], p.Env["CUDA_DEVICE_ORDER"], p.Env["DDP_AGENT_GPU"])
		}
	}
	if !strings.Contains(r.stderr.String(), "placement: ") {
		t.Errorf("no warning that the DGX's CPUs are not this host's\n%s", r.logs())
	}

	// Four GPUs given by the scheduler, out of order: the workers use
	// exactly those.
	r = startAgent(t, []string{"DDP_AGENT_TOPOLOGY=" + saved, "CUDA_VISIBLE_DEVICES=6,7,0,1"}, "--nproc-per-node", "gpu", "--numa-binding", "none", "place.py")
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	ps := readPlaced(t, r, 4)
	order := strings.Split(ps[0].Env["CUDA_VISIBLE_DEVICES"], ",")
	for rank, p := range ps {
		idx, _ := strconv.Atoi(order[rank])
		if p.Env["DDP_AGENT_GPU"] != topo.GPUs[idx].UUID {
			t.Errorf("rank %d: GPU %q, want GPU %d of CUDA_VISIBLE_DEVICES=%s", rank, p.Env["DDP_AGENT_GPU"], idx, ps[0].Env["CUDA_VISIBLE_DEVICES"])
		}
	}
	if got := slices.Sorted(slices.Values(order)); strings.Join(got, ",") != "0,1,6,7" {
		t.Errorf("CUDA_VISIBLE_DEVICES %v: want a reordering of 6,7,0,1", order)
	}

	// --virtual-local-rank: each worker sees its own GPU alone, as
	// device 0, with LOCAL_RANK 0.
	r = startAgent(t, []string{"DDP_AGENT_TOPOLOGY=" + saved, "CUDA_VISIBLE_DEVICES=6,7,0,1"}, "--nproc-per-node", "gpu", "--numa-binding", "none", "--virtual-local-rank", "place.py")
	if code := r.wait(30 * time.Second); code != 0 {
		t.Fatalf("exit %d\n%s", code, r.logs())
	}
	for rank, p := range readPlaced(t, r, 4) {
		idx, _ := strconv.Atoi(p.Env["CUDA_VISIBLE_DEVICES"])
		if p.Env["LOCAL_RANK"] != "0" || strings.Contains(p.Env["CUDA_VISIBLE_DEVICES"], ",") || p.Env["DDP_AGENT_GPU"] != topo.GPUs[idx].UUID || order[rank] != p.Env["CUDA_VISIBLE_DEVICES"] {
			t.Errorf("rank %d: LOCAL_RANK %q CUDA_VISIBLE_DEVICES %q DDP_AGENT_GPU %q, want 0, GPU %s alone, its UUID", rank,
				p.Env["LOCAL_RANK"], p.Env["CUDA_VISIBLE_DEVICES"], p.Env["DDP_AGENT_GPU"], order[rank])
		}
	}

	// A saved topology that is not one is a usage error.
	bad := filepath.Join(t.TempDir(), "bad.json")
	os.WriteFile(bad, []byte("{"), 0o644)
	r = startAgent(t, []string{"DDP_AGENT_TOPOLOGY=" + bad}, "place.py")
	if code := r.wait(10 * time.Second); code != 2 || !strings.Contains(r.stderr.String(), "DDP_AGENT_TOPOLOGY") {
		t.Errorf("bad DDP_AGENT_TOPOLOGY: exit %d\n%s", code, r.logs())
	}
}

// TestNUMABinding: two GPUs on this host's NUMA node 0; the workers' CPU
// sets and memory policy, as the kernel reports them, are the plan's.
func TestNUMABinding(t *testing.T) {
	budgetAlongside(t, 10*time.Second)
	host, err := nvml.DiscoverHost(t.Context())
	if err != nil || len(host.NUMANodes) == 0 {
		t.Skipf("no NUMA layout: %v", err)
	}
	allowed, err := placement.Affinity()
	if err != nil || len(allowed) < 2 {
		t.Skipf("needs 2 CPUs, has %v (%v)", allowed, err)
	}
	node := host.NUMANodes[0]
	gpu := func(i int) nvml.GPU {
		return nvml.GPU{Index: i, UUID: fmt.Sprintf("GPU-e2e0000%d-0000-0000-0000-000000000000", i), Name: "Test GPU", MemoryTotal: 1 << 30,
			BusID: fmt.Sprintf("00000000:%02X:00.0", i+1), NUMANode: node.ID, GPUNUMANode: -1, CPUAffinity: node.CPUs, MIG: nvml.MIGUnsupported}
	}
	topo := &nvml.Topology{Driver: "test", GPUs: []nvml.GPU{gpu(0), gpu(1)}, Host: host, Links: [][]nvml.Link{
		{{PCIe: nvml.PathSelf}, {PCIe: nvml.PathPIX}},
		{{PCIe: nvml.PathPIX}, {PCIe: nvml.PathSelf}},
	}}
	saved := saveTopology(t, topo)
	for _, tc := range []struct {
		mode, policy string
	}{
		{"node", fmt.Sprintf("prefer:%d", node.ID)},
		{"exclusive", fmt.Sprintf("bind:%d", node.ID)},
		{"none", "default"},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			plan, err := placement.New(placement.Input{Topology: topo, NProc: 2, Mode: placement.Mode(tc.mode), Allowed: allowed, SysFS: os.DirFS("/sys")})
			if err != nil {
				t.Skipf("this host cannot take the plan: %v", err)
			}
			r := startAgent(t, []string{"DDP_AGENT_TOPOLOGY=" + saved}, "--nproc-per-node", "gpu", "--numa-binding", tc.mode, "place.py")
			if code := r.wait(30 * time.Second); code != 0 {
				t.Fatalf("exit %d\n%s", code, r.logs())
			}
			for rank, p := range readPlaced(t, r, 2) {
				want := plan.Workers[rank].CPUs.String()
				if tc.mode == "none" {
					want = allowed.String()
				}
				if p.CPUs != want || p.MemPolicy != tc.policy {
					t.Errorf("rank %d: CPUs %q, memory policy %q; want %q and %q", rank, p.CPUs, p.MemPolicy, want, tc.policy)
				}
			}
		})
	}
}

// agentOutput runs ddp-agent with args and returns its stdout.
func agentOutput(t *testing.T, args ...string) string {
	t.Helper()
	out, err := osexec.Command(agentBin, args...).Output()
	if err != nil {
		t.Fatalf("ddp-agent %s: %v", strings.Join(args, " "), err)
	}
	return string(out)
}

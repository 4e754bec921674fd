package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// skipWithDriver skips tests of the CPU-only path on a node with NVML.
func skipWithDriver(t *testing.T) {
	t.Helper()
	if lib, err := nvml.Open(); err == nil {
		lib.Shutdown()
		t.Skip("this node has an NVIDIA driver")
	}
}

// TestTopoCPUOnly runs ddp-agent topo on this machine, which has no NVIDIA
// driver: one line says so, then the CPU/NUMA layout, exit code 0.
func TestTopoCPUOnly(t *testing.T) {
	skipWithDriver(t)
	var out, errb bytes.Buffer
	if code := run([]string{"topo"}, &out, &errb); code != 0 {
		t.Fatalf("exit code %d, stderr %q", code, errb.String())
	}
	if errb.Len() != 0 {
		t.Errorf("stderr: got %q, want nothing", errb.String())
	}
	lines := strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
	if !regexp.MustCompile(`^no NVIDIA GPU: libnvidia-ml\.so\.1 [^\n]+; CPU-only node$`).MatchString(lines[0]) {
		t.Errorf("first line: got %q, want the no-GPU line", lines[0])
	}
	rest := strings.Join(lines[1:], "\n")
	for _, want := range []string{"CPU(s):", "On-line CPU(s) list:", "NUMA node(s):"} {
		if !strings.Contains(rest, want) {
			t.Errorf("no %q in the layout:\n%s", want, out.String())
		}
	}
	if strings.Count(out.String(), "NVIDIA") != 1 {
		t.Errorf("got more than one line about the GPU:\n%s", out.String())
	}
	t.Logf("output:\n%s", out.String())
}

func TestTopoCPUOnlyJSON(t *testing.T) {
	skipWithDriver(t)
	var out, errb bytes.Buffer
	if code := run([]string{"topo", "--json"}, &out, &errb); code != 0 {
		t.Fatalf("exit code %d, stderr %q", code, errb.String())
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(out.Bytes(), &raw); err != nil {
		t.Fatalf("%v in %s", err, out.String())
	}
	if string(raw["gpus"]) != "[]" {
		t.Errorf(`"gpus": got %s, want []`, raw["gpus"])
	}
	var got struct {
		nvml.Topology
		NoGPU string `json:"no_gpu"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(got.NoGPU, "libnvidia-ml.so.1") {
		t.Errorf(`"no_gpu": got %q, want why`, got.NoGPU)
	}
	if got.Host.CPUs <= 0 || len(got.Host.OnlineCPUs) == 0 {
		t.Errorf("host: got %+v, want the CPU layout", got.Host)
	}
	t.Logf("output: %s", out.String())
}

// fakeTopology is two GPUs joined by an NVLink bridge on a one-node box.
func fakeTopology() *nvml.Topology {
	cpus := nvml.CPUList{0, 1, 2, 3}
	gpu := func(i int) nvml.GPU {
		return nvml.GPU{
			Index: i, UUID: fmt.Sprintf("GPU-%d", i), Name: "NVIDIA RTX A6000", MemoryTotal: 48 << 30,
			BusID: fmt.Sprintf("00000000:%02X:00.0", i+1), NUMANode: 0, GPUNUMANode: -1, CPUAffinity: cpus,
			ComputeCapability: "8.6", MIG: nvml.MIGUnsupported, NVLinks: 4,
		}
	}
	self := nvml.Link{PCIe: nvml.PathSelf, P2PRead: "X", P2PNVLink: "X"}
	nv4 := nvml.Link{NVLinks: 4, NVLinkVersion: "3.0", PCIe: nvml.PathPHB, P2PRead: "OK", P2PNVLink: "OK"}
	return &nvml.Topology{
		Driver: "550.54.15", CUDA: "12.4",
		GPUs:  []nvml.GPU{gpu(0), gpu(1)},
		Links: [][]nvml.Link{{self, nv4}, {nv4, self}},
		Host: nvml.HostInfo{CPUs: 4, Cores: 4, Sockets: 1, OnlineCPUs: cpus,
			NUMANodes: []nvml.NUMANode{{ID: 0, CPUs: cpus, MemoryTotal: 64 << 30}}},
		Notes: []string{"GPU1: memory affinity: ERROR_UNKNOWN"},
	}
}

func TestTopoWithGPUs(t *testing.T) {
	src := topoSources{
		gpus: func(context.Context) (*nvml.Topology, error) { return fakeTopology(), nil },
		host: func(context.Context) (nvml.HostInfo, error) { t.Error("host read again"); return nvml.HostInfo{}, nil },
	}
	var out, errb bytes.Buffer
	if code := runTopoWith(t.Context(), nil, &out, &errb, src); code != 0 {
		t.Fatalf("exit code %d, stderr %q", code, errb.String())
	}
	want := "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n" +
		"GPU0\t X \tNV4\t0-3\t0\t\tN/A\n" +
		"GPU1\tNV4\t X \t0-3\t0\t\tN/A\n" +
		"\nLegend:\n"
	if !strings.HasPrefix(out.String(), want) {
		t.Errorf("got\n%s\nwant it to start with\n%s", out.String(), want)
	}
	for _, want := range []string{
		"  NV#  = Connection traversing a bonded set of # NVLinks\n\nDriver Version: 550.54.15   CUDA Version: 12.4   NVSwitch: no\n",
		"GPU 1: NVIDIA RTX A6000 (UUID: GPU-1)  bus 00000000:02:00.0  49152 MiB  compute 8.6  MIG unsupported  NVLinks 4\n\nCPU(s):",
		"NUMA node0 CPU(s):   0-3  (64 GiB memory)\nNOTE: GPU1: memory affinity: ERROR_UNKNOWN\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("no %q in\n%s", want, out.String())
		}
	}

	out.Reset()
	if code := runTopoWith(t.Context(), []string{"--json"}, &out, &errb, src); code != 0 {
		t.Fatalf("--json: exit code %d, stderr %q", code, errb.String())
	}
	var got struct {
		nvml.Topology
		NoGPU *string `json:"no_gpu"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.NoGPU != nil || len(got.GPUs) != 2 || got.GPUs[1].UUID != "GPU-1" || got.Links[0][1].Class() != "NV4" {
		t.Errorf("--json: got %s", out.String())
	}
}

func TestTopoNoDriverPaths(t *testing.T) {
	host := nvml.HostInfo{CPUs: 2, OnlineCPUs: nvml.CPUList{0, 1}, NUMANodes: []nvml.NUMANode{}}
	for _, tc := range []struct {
		name    string
		gpus    func(context.Context) (*nvml.Topology, error)
		hostErr error
		code    int
		wantOut string
		wantErr string
	}{
		{
			name: "no library",
			gpus: func(context.Context) (*nvml.Topology, error) {
				return nil, &nvml.NoDriverError{Reason: "libnvidia-ml.so.1 not found"}
			},
			code: 0, wantOut: "no NVIDIA GPU: libnvidia-ml.so.1 not found; CPU-only node\nCPU(s):              2\n",
		},
		{
			name: "driver, no GPUs",
			gpus: func(context.Context) (*nvml.Topology, error) {
				return &nvml.Topology{Driver: "550.54.15", GPUs: []nvml.GPU{}, Links: [][]nvml.Link{}, Host: host}, nil
			},
			code: 0, wantOut: "no NVIDIA GPU: the NVIDIA driver 550.54.15 reports no GPUs; CPU-only node\nCPU(s):              2\n",
		},
		{
			name: "host partly unreadable",
			gpus: func(context.Context) (*nvml.Topology, error) {
				return nil, fmt.Errorf("load: %w", nvml.ErrNoDriver)
			},
			hostErr: errors.New("cpu info: no /proc"),
			code:    0, wantOut: "NOTE: host: cpu info: no /proc\n",
		},
		{
			name: "NVML broken",
			gpus: func(context.Context) (*nvml.Topology, error) {
				return nil, errors.New("nvml: count GPUs: ERROR_UNKNOWN")
			},
			code: 1, wantErr: "ddp-agent topo: nvml: count GPUs: ERROR_UNKNOWN\n",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := topoSources{gpus: tc.gpus, host: func(context.Context) (nvml.HostInfo, error) { return host, tc.hostErr }}
			var out, errb bytes.Buffer
			code := runTopoWith(t.Context(), nil, &out, &errb, src)
			if code != tc.code || !strings.Contains(out.String(), tc.wantOut) || errb.String() != tc.wantErr {
				t.Errorf("got %d, stdout %q, stderr %q; want %d, stdout with %q, stderr %q",
					code, out.String(), errb.String(), tc.code, tc.wantOut, tc.wantErr)
			}
		})
	}
}

func TestTopoUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		out  string
		err  string
	}{
		{[]string{"help", "topo"}, 0, "Usage: ddp-agent topo [--json]", ""},
		{[]string{"topo", "--help"}, 0, "Usage: ddp-agent topo [--json]", ""},
		{[]string{"topo", "--jsn"}, 2, "", `ddp-agent topo: unexpected argument "--jsn"`},
		{[]string{"help"}, 0, "ddp-agent topo [--json]", ""},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.err) {
			t.Errorf("%v: got %d, %q, %q; want %d, %q, %q", tc.args, code, out.String(), errb.String(), tc.code, tc.out, tc.err)
		}
	}
}

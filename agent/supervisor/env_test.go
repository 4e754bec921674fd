package supervisor

import (
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, dup := m[k]; dup {
			m[k] = "DUPLICATE"
			continue
		}
		m[k] = v
	}
	return m
}

func TestWorkerEnv(t *testing.T) {
	spec := &Spec{NProc: 4, RankOffset: 4, WorldSize: 8, NodeRank: 1, NNodes: 2, MasterAddr: "10.0.0.1", MasterPort: 29500,
		RunID: "job1", Role: "trainer", RestartCount: 2, MaxRestarts: 3, Generation: 7, ControlSocket: "/run/ddp/control.sock"}
	tests := []struct {
		name   string
		base   []string
		placed map[string]string
		want   map[string]string
	}{
		{
			name: "torchrun variables",
			base: []string{"PATH=/bin", "RANK=99"},
			want: map[string]string{
				"PATH": "/bin", "LOCAL_RANK": "2", "RANK": "6", "GROUP_RANK": "1", "ROLE_RANK": "6", "ROLE_NAME": "trainer",
				"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "8", "GROUP_WORLD_SIZE": "2", "ROLE_WORLD_SIZE": "8",
				"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RESTART_COUNT": "2",
				"TORCHELASTIC_MAX_RESTARTS": "3", "TORCHELASTIC_RUN_ID": "job1", "TORCHELASTIC_USE_AGENT_STORE": "False",
				"TORCHELASTIC_ERROR_FILE": "/tmp/e.json", "OMP_NUM_THREADS": "1", "NCCL_ASYNC_ERROR_HANDLING": "1",
				"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "DDP_AGENT_SOCKET": "/run/ddp/control.sock", "DDP_AGENT_GENERATION": "7",
				"DDP_AGENT_COMM_NOTE_FILE": "/tmp/p.json",
			},
		},
		{
			name: "user settings win for defaults",
			base: []string{"OMP_NUM_THREADS=8", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0"},
			want: map[string]string{"OMP_NUM_THREADS": "8", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0", "NCCL_ASYNC_ERROR_HANDLING": "1"},
		},
		{
			// The placement is computed from the agent's own
			// CUDA_VISIBLE_DEVICES, so it replaces it; torchrun's variables
			// cannot be overridden by it.
			name:   "placement over the agent's environment",
			base:   []string{"CUDA_VISIBLE_DEVICES=3,1", "PATH=/bin"},
			placed: map[string]string{"CUDA_VISIBLE_DEVICES": "1,3", "DDP_AGENT_GPU": "GPU-1", "RANK": "0"},
			want:   map[string]string{"CUDA_VISIBLE_DEVICES": "1,3", "DDP_AGENT_GPU": "GPU-1", "RANK": "6", "PATH": "/bin"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := envMap(workerEnv(tc.base, spec, Worker{LocalRank: 2, Rank: 6}, "/tmp/e.json", "/tmp/p.json", tc.placed))
			for k, v := range tc.want {
				if got[k] != v {
					t.Errorf("%s: got %q, want %q", k, got[k], v)
				}
			}
		})
	}
}

// TestWorkerEnvWorldFile: the world file is named only where the agent
// writes one (--spares).
func TestWorkerEnvWorldFile(t *testing.T) {
	spec := &Spec{NProc: 1, WorldSize: 1, NNodes: 1}
	if v, ok := envMap(workerEnv(nil, spec, Worker{}, "", "", nil))[envname.WorldFile]; ok {
		t.Errorf("%s=%q without a world file", envname.WorldFile, v)
	}
	spec.WorldFile = "/run/ddp/world.json"
	if v := envMap(workerEnv(nil, spec, Worker{}, "", "", nil))[envname.WorldFile]; v != spec.WorldFile {
		t.Errorf("%s=%q, want %q", envname.WorldFile, v, spec.WorldFile)
	}
}

func TestWorkerEnvSingleProcNoOMP(t *testing.T) {
	got := envMap(workerEnv(nil, &Spec{NProc: 1, WorldSize: 1}, Worker{}, "e", "p", nil))
	if _, ok := got["OMP_NUM_THREADS"]; ok {
		t.Error("OMP_NUM_THREADS set for a single worker; torchrun leaves it alone")
	}
	if _, ok := got["DDP_AGENT_SOCKET"]; ok {
		t.Error("DDP_AGENT_SOCKET set without a control socket")
	}
}

// TestWorkerEnvSignalsToHandle: the workers are told the signals the
// launcher stops on, as torch 2.x's torchrun does (its default without
// --signals-to-handle).
func TestWorkerEnvSignalsToHandle(t *testing.T) {
	for _, tc := range []struct{ given, want string }{
		{"", "SIGTERM,SIGINT,SIGHUP,SIGQUIT"},
		{"SIGTERM,SIGUSR1", "SIGTERM,SIGUSR1"},
	} {
		spec := &Spec{NProc: 1, WorldSize: 1, NNodes: 1, SignalsToHandle: tc.given}
		got := envMap(workerEnv(nil, spec, Worker{}, "/tmp/e.json", "/tmp/p.json", nil))["TORCHELASTIC_SIGNALS_TO_HANDLE"]
		if got != tc.want {
			t.Errorf("--signals-to-handle %q: TORCHELASTIC_SIGNALS_TO_HANDLE=%q, want %q", tc.given, got, tc.want)
		}
	}
}

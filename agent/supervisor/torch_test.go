package supervisor

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestAsyncErrorHandlingVars(t *testing.T) {
	tests := []struct {
		version string
		want    []string
	}{
		{"", []string{"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}},
		{"garbage", []string{"NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"}},
		{"1.13.1", []string{"NCCL_ASYNC_ERROR_HANDLING"}},
		{"2.1.2+cu121", []string{"NCCL_ASYNC_ERROR_HANDLING"}},
		{"2.2.0a0+git1234", []string{"TORCH_NCCL_ASYNC_ERROR_HANDLING"}},
		{"2.11.0+cu130", []string{"TORCH_NCCL_ASYNC_ERROR_HANDLING"}},
		{"3.0", []string{"TORCH_NCCL_ASYNC_ERROR_HANDLING"}},
	}
	for _, tc := range tests {
		t.Run(tc.version, func(t *testing.T) {
			if got := asyncErrorHandlingVars(tc.version); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestWorkerEnvTorchVersion(t *testing.T) {
	for _, tc := range []struct {
		version   string
		old, torc bool
	}{{"1.13.1", true, false}, {"2.11.0", false, true}, {"", true, true}} {
		got := envMap(workerEnv(nil, &Spec{NProc: 1, WorldSize: 1, TorchVersion: tc.version}, Worker{}, "e", "p", nil))
		_, old := got["NCCL_ASYNC_ERROR_HANDLING"]
		_, torc := got["TORCH_NCCL_ASYNC_ERROR_HANDLING"]
		if old != tc.old || torc != tc.torc {
			t.Errorf("torch %q: NCCL_ASYNC_ERROR_HANDLING set %v, TORCH_NCCL_ASYNC_ERROR_HANDLING set %v; want %v, %v",
				tc.version, old, torc, tc.old, tc.torc)
		}
	}
}

// TestTorchVersion probes a real interpreter with a fake torch package on
// its path: the version comes from torch/version.py, and torch itself is
// never imported (its __init__ would fail the probe).
func TestTorchVersion(t *testing.T) {
	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	dir := t.TempDir()
	pkg := filepath.Join(dir, "torch")
	if err := os.Mkdir(pkg, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "__init__.py"), []byte("raise SystemExit('torch imported')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pkg, "version.py"), []byte("__version__ = '2.11.0+cu130'\ngit_version = 'x'\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", dir)
	if got, err := TorchVersion(context.Background(), python, 10*time.Second); got != "2.11.0+cu130" || err != nil {
		t.Errorf("got %q, %v; want %q", got, err, "2.11.0+cu130")
	}
	if got, err := TorchVersion(context.Background(), filepath.Join(dir, "no-such-python"), 10*time.Second); got != "" || err == nil || errors.Is(err, ErrNoTorch) {
		t.Errorf("missing interpreter: got %q, %v; want \"\" and an error other than ErrNoTorch", got, err)
	}
	// An interpreter that runs and finds no torch (-S: no site-packages,
	// where the machine's torch may be): the user's --python is likely not
	// the one the job needs (main warns).
	t.Setenv("PYTHONPATH", t.TempDir())
	bare := filepath.Join(dir, "bare-python")
	if err := os.WriteFile(bare, []byte("#!/bin/sh\nexec "+python+" -S \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := TorchVersion(context.Background(), bare, 10*time.Second); got != "" || !errors.Is(err, ErrNoTorch) {
		t.Errorf("no torch on the path: got %q, %v; want ErrNoTorch", got, err)
	}
}

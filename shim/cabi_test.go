package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// buildShim builds libddpshim.so into dir, as make build does.
func buildShim(t *testing.T, dir string) string {
	t.Helper()
	so := filepath.Join(dir, "libddpshim.so")
	cmd := exec.Command("go", "build", "-buildmode=c-shared", "-o", so, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildmode=c-shared: %v\n%s", err, out)
	}
	return so
}

// TestCABI compiles testdata/cabi.c against ddpshim.h, links it with the
// freshly built library and runs it: every function, with good and bad
// arguments, a world of one and a world of two (shared memory and TCP).
func TestCABI(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Fatal("gcc is needed to build the shim and this test (apt-get install gcc)")
	}
	dir := t.TempDir()
	buildShim(t, dir)
	bin := filepath.Join(dir, "cabi")
	cc := exec.Command("gcc", "-std=c11", "-Wall", "-Werror", "-O1", "-I.", "-o", bin, "testdata/cabi.c",
		"-L"+dir, "-lddpshim", "-Wl,-rpath,"+dir, "-lpthread")
	if out, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("compile cabi.c: %v\n%s", err, out)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin).CombinedOutput()
	t.Logf("cabi output:\n%s", out)
	if err != nil || !strings.Contains(string(out), "PASS") {
		t.Fatalf("cabi: %v", err)
	}
	if !strings.Contains(string(out), `"transport":"shm"`) || !strings.Contains(string(out), `"transport":"tcp"`) {
		t.Errorf("want one world of two over shm and one over tcp")
	}
}

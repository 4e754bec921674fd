package main

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The shim's import graph, locked: the kinds of failure (package failure)
// and the bottom of the C ABI (package status) must not know the
// transports, so that a transport can be added, changed or removed
// without touching them, and no transport is linked in by way of them.
// Checked with the go command's own view of the graph (go list's Deps,
// every package imported directly or not), as Tailscale's deptest does.
//
// How it was seen to fail: with `_ ".../ncclshim/host"` imported in
// status/status.go, "status knows no transport" failed naming
// ncclshim/host and ncclshim/host/shm; with `_ ".../ncclshim/reduce"` in
// failure/failure.go, "failure is a leaf" failed naming ncclshim/reduce.
// The canary case keeps the check honest without such an edit: it asks
// the same question of package comm, which must find the transports.

const module = "github.com/ddp-agent/ddp-agent"

// transports are the packages that carry collectives, and the
// communicator above them.
var transports = []string{
	module + "/ncclshim/host", // and host/shm
	module + "/ncclshim/nccl",
	module + "/ncclshim/comm",
}

func TestDeps(t *testing.T) {
	tests := []struct {
		name   string
		pkg    string
		forbid []string // import paths, each with the packages below it
		canary bool     // the check must find something: it can fail
	}{
		{"failure is a leaf", "./failure", []string{module}, false},
		{"status knows no transport", "./status", transports, false},
		{"canary: comm imports the transports", "./comm", transports, true},
	}
	pkgs := make([]string, 0, len(tests))
	for _, tc := range tests {
		pkgs = append(pkgs, tc.pkg)
	}
	deps := listDeps(t, pkgs...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := module + "/ncclshim/" + strings.TrimPrefix(tc.pkg, "./")
			d, ok := deps[path]
			if !ok {
				t.Fatalf("go list said nothing of %s", path)
			}
			bad := forbidden(d, tc.forbid)
			switch {
			case tc.canary && len(bad) == 0:
				t.Errorf("%s: got no forbidden imports, want some: the check cannot fail", path)
			case !tc.canary:
				for _, b := range bad {
					t.Errorf("%s imports %s, which it must not (directly or through another package)", path, b)
				}
			}
		})
	}
}

// forbidden returns the deps that are one of prefixes or below one.
func forbidden(deps, prefixes []string) []string {
	var bad []string
	for _, d := range deps {
		if slices.ContainsFunc(prefixes, func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") }) {
			bad = append(bad, d)
		}
	}
	return bad
}

func TestForbidden(t *testing.T) {
	tests := []struct {
		name     string
		deps     []string
		prefixes []string
		want     []string
	}{
		{"none", []string{"fmt", module + "/ncclshim/failure"}, transports, nil},
		{"exact", []string{"fmt", module + "/ncclshim/nccl"}, transports, []string{module + "/ncclshim/nccl"}},
		{"below", []string{module + "/ncclshim/host/shm"}, transports, []string{module + "/ncclshim/host/shm"}},
		{"a name that only starts alike", []string{module + "/ncclshim/hostile"}, transports, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := forbidden(tc.deps, tc.prefixes); !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// listDeps returns each package's transitive imports, by import path, as
// go list sees them (test files excluded: tests may import what
// they like).
func listDeps(t *testing.T, pkgs ...string) map[string][]string {
	t.Helper()
	args := append([]string{"list", "-json=ImportPath,Deps"}, pkgs...)
	out, err := exec.Command("go", args...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list: %v\n%s", err, ee.Stderr)
		}
		t.Fatalf("go list: %v", err)
	}
	deps := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p struct {
			ImportPath string
			Deps       []string
		}
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("decode go list's output: %v", err)
		}
		deps[p.ImportPath] = p.Deps
	}
	return deps
}

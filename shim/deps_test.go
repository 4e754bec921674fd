package main

import (
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/internal/deptest"
)

// The shim's import graph, locked: the kinds of failure (package failure)
// and the bottom of the C ABI (package status) must not know the
// transports, so that a transport can be added, changed or removed
// without touching them, and no transport is linked in by way of them.
// Checked with the go command's own view of the graph (go list's Deps,
// every package imported directly or not), as Tailscale's deptest does.
//
// How it was seen to fail: with `_ ".../shim/host"` imported in
// status/status.go, "status knows no transport" failed naming
// shim/host and shim/host/shm; with `_ ".../shim/reduce"` in
// failure/failure.go, "failure is a leaf" failed naming shim/reduce.
// The canary case keeps the check honest without such an edit: it asks
// the same question of package comm, which must find the transports.

const module = "github.com/ddp-agent/ddp-agent"

// transports are the packages that carry collectives, and the
// communicator above them.
var transports = []string{
	module + "/shim/host", // and host/shm
	module + "/shim/nccl",
	module + "/shim/comm",
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
	deps := deptest.List(t, pkgs...)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := module + "/shim/" + strings.TrimPrefix(tc.pkg, "./")
			d, ok := deps[path]
			if !ok {
				t.Fatalf("go list said nothing of %s", path)
			}
			bad := deptest.Forbidden(d, tc.forbid)
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

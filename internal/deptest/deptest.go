// Package deptest locks the module's import graph in tests, as Tailscale's
// tstest/deptest does: List asks the go command for each package's
// transitive imports (test files excluded: tests may import what they
// like), and Forbidden picks the ones a rule refuses. The tests that use it
// (agent, agent/telemetry, shim) say which edges the design forbids.
package deptest

import (
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// List returns, for every package the patterns name, its transitive
// imports by import path, as `go list -json` reports them. It fails t when
// the go command cannot be run or says nothing.
func List(t testing.TB, patterns ...string) map[string][]string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages' dependencies: %v", err)
	}
	out, err := exec.Command(goTool, append([]string{"list", "-json=ImportPath,Deps"}, patterns...)...).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("go list %s: %v\n%s", strings.Join(patterns, " "), err, ee.Stderr)
		}
		t.Fatalf("go list %s: %v", strings.Join(patterns, " "), err)
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
	if len(deps) == 0 {
		t.Fatalf("go list %s named no package", strings.Join(patterns, " "))
	}
	return deps
}

// Forbidden returns the deps that are one of prefixes or a package below
// one (a path that only starts alike, ".../hostile" for ".../host", is not).
func Forbidden(deps, prefixes []string) []string {
	var bad []string
	for _, d := range deps {
		if slices.ContainsFunc(prefixes, func(p string) bool { return d == p || strings.HasPrefix(d, p+"/") }) {
			bad = append(bad, d)
		}
	}
	return bad
}

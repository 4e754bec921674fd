package agent

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// root is the agent root's import path.
const root = "github.com/ddp-agent/ddp-agent/agent"

// TestNoImportUpAFloor locks the graph: no package below the agent root
// (rootcause, straggler, supervisor, …) depends on the root, even
// indirectly; only the command does. A part that needs something of the
// agent declares a small interface or takes functions instead.
//
// A package the root imports (rootcause, straggler) cannot import it back
// without a cycle the build refuses; this catches the others. Checked that
// it fails: a throwaway agent/zzfloortmp importing the root failed it
// ("…/agent/zzfloortmp depends on …/agent: an import runs back up a
// floor"); with it removed it passes.
func TestNoImportUpAFloor(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages' dependencies: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), goTool, "list", "-f", `{{.ImportPath}}{{range .Deps}} {{.}}{{end}}`, root+"/...")
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			stderr = ee.Stderr
		}
		t.Fatalf("go list: %v\n%s", err, stderr)
	}
	below := 0
	for line := range strings.Lines(string(out)) {
		fields := strings.Fields(line)
		if len(fields) == 0 || fields[0] == root || strings.HasPrefix(fields[0], root+"/cmd/") {
			continue
		}
		below++
		for _, dep := range fields[1:] {
			if dep == root {
				t.Errorf("%s depends on %s: an import runs back up a floor", fields[0], root)
			}
		}
	}
	if below < 10 {
		t.Fatalf("go list named %d packages below the agent root, want them all:\n%s", below, out)
	}
}

// TestModesApart: run mode (this package) and sidecar mode (agent/sidecar)
// share agent/observe and the packages below, never each other; and
// neither reaches into the other through the command. Checked that it
// fails: a blank import of agent/sidecar in a (non-test) file of this package
// made it name it.
func TestModesApart(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command, to list the packages' dependencies: %v", err)
	}
	for _, tc := range []struct{ pkg, forbidden string }{
		{root, root + "/sidecar"},
		{root + "/sidecar", root},
		{root + "/observe", root + "/sidecar"},
	} {
		out, err := exec.CommandContext(t.Context(), goTool, "list", "-deps", tc.pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", tc.pkg, err)
		}
		for dep := range strings.Lines(string(out)) {
			if strings.TrimSpace(dep) == tc.forbidden {
				t.Errorf("%s depends on %s", tc.pkg, tc.forbidden)
			}
		}
	}
}

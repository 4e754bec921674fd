package agent

import (
	"slices"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/internal/deptest"
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
	below := 0
	for pkg, deps := range deptest.List(t, root+"/...") {
		if pkg == root || strings.HasPrefix(pkg, root+"/cmd/") {
			continue
		}
		below++
		if slices.Contains(deps, root) {
			t.Errorf("%s depends on %s: an import runs back up a floor", pkg, root)
		}
	}
	if below < 10 {
		t.Fatalf("go list named %d packages below the agent root, want them all", below)
	}
}

// TestModesApart: run mode (this package) and sidecar mode (agent/sidecar)
// share agent/observe and the packages below, never each other; and
// neither reaches into the other through the command. Checked that it
// fails: a blank import of agent/sidecar in a (non-test) file of this package
// made it name it.
func TestModesApart(t *testing.T) {
	for _, tc := range []struct{ pkg, forbidden string }{
		{root, root + "/sidecar"},
		{root + "/sidecar", root},
		{root + "/observe", root + "/sidecar"},
	} {
		deps := deptest.List(t, tc.pkg)[tc.pkg]
		if slices.Contains(deps, tc.forbidden) {
			t.Errorf("%s depends on %s", tc.pkg, tc.forbidden)
		}
	}
}

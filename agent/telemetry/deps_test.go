package telemetry

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/internal/deptest"
)

// module is this module's path, the root of the names below.
const module = "github.com/ddp-agent/ddp-agent"

// offGraph says whether a telemetry package may not depend on dep: the
// rendezvous and its store, the control socket, the sidecar, the agent
// itself, and etcd. Telemetry is consumed by those; it declares the small
// interfaces it needs of them (watch.KV, watch.Publisher) and owns the
// report they carry (Report), so it never reaches sideways.
func offGraph(dep string) bool {
	for _, p := range []string{module + "/agent/rdzv", module + "/agent/control", module + "/agent/sidecar", "go.etcd.io/etcd"} {
		if dep == p || strings.HasPrefix(dep, p+"/") {
			return true
		}
	}
	return dep == module+"/agent"
}

func TestOffGraph(t *testing.T) {
	for _, tc := range []struct {
		dep  string
		want bool
	}{
		{module + "/agent/rdzv", true},
		{module + "/agent/rdzv/store", true},
		{module + "/agent/control", true},
		{module + "/agent/sidecar", true},
		{module + "/agent", true},
		{"go.etcd.io/etcd/client/v3", true},
		{"go.etcd.io/etcd/api/v3/mvccpb", true},
		{module + "/agent/telemetry/stall", false},
		{module + "/agent/rdzvx", false},
		{module + "/agent/hostmon", false},
		{module + "/wire", false},
		{"go.etcd.io/raft/v3", false},
		{"net/http", false},
	} {
		if got := offGraph(tc.dep); got != tc.want {
			t.Errorf("offGraph(%q): got %v, want %v", tc.dep, got, tc.want)
		}
	}
}

// TestTelemetryStaysOffTheStore locks the graph: no package under
// agent/telemetry depends, even indirectly, on what offGraph names.
//
// Checked that it fails: with `_ "github.com/ddp-agent/ddp-agent/agent/rdzv"`
// added to watch's imports it failed ("…/telemetry/watch depends on
// …/agent/rdzv, …/agent/rdzv/store, go.etcd.io/etcd/api/v3/authpb, …, 80
// more"); with the import removed it passes. TestOffGraph checks the
// names it refuses.
func TestTelemetryStaysOffTheStore(t *testing.T) {
	deps := deptest.List(t, module+"/agent/telemetry/...")
	for pkg, d := range deps {
		var bad []string
		for _, dep := range d {
			if offGraph(dep) {
				bad = append(bad, dep)
			}
		}
		if n := len(bad); n > 4 {
			bad = append(bad[:4], fmt.Sprintf("%d more", n-4))
		}
		if len(bad) > 0 {
			t.Errorf("%s depends on %s: telemetry must not reach sideways (declare the interface it consumes instead)", pkg, strings.Join(bad, ", "))
		}
	}
	if len(deps) < 5 { // telemetry, stall, watch, relay, export at least
		t.Fatalf("go list named %d packages, want every package under agent/telemetry", len(deps))
	}
}

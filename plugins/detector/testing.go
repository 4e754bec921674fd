package detector

import (
	"testing"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// TestClient serves impl in this test process and returns the agent's
// side of it: every call goes through the real gRPC glue (the wire
// messages, the severity and action checks, the stream), as it would from
// the agent, without building a binary. The connection closes when the
// test ends.
//
//	func TestMine(t *testing.T) {
//		d := detector.TestClient(t, mine.New())
//		sched, err := d.Configure(ctx, plugins.Config{"path": "/scratch"})
//		...
//	}
func TestClient(t testing.TB, impl Detector) Detector {
	t.Helper()
	conn, _ := goplugin.TestPluginGRPCConn(t, false, pluginSet(impl))
	t.Cleanup(func() { _ = conn.Close() })
	raw, err := conn.Dispense(string(plugins.KindDetector))
	if err != nil {
		t.Fatalf("detector.TestClient: dispense: %v", err)
	}
	d, ok := raw.(Detector)
	if !ok {
		t.Fatalf("detector.TestClient: dispensed %T, not a Detector", raw)
	}
	return d
}

package notifier

import (
	"testing"

	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// TestClient serves impl in this test process and returns the agent's
// side of it: every call goes through the real gRPC glue (the wire
// messages, the checks), as it would from the agent, without building a
// binary. The connection closes when the test ends.
//
//	func TestMine(t *testing.T) {
//		n := notifier.TestClient(t, mine.New())
//		err := n.Notify(ctx, notifier.Event{Kind: notifier.JobStarted, Rank: -1})
//		...
//	}
func TestClient(t testing.TB, impl Notifier) Notifier {
	t.Helper()
	conn, _ := goplugin.TestPluginGRPCConn(t, false, pluginSet(impl))
	t.Cleanup(func() { _ = conn.Close() })
	raw, err := conn.Dispense(string(plugins.KindNotifier))
	if err != nil {
		t.Fatalf("notifier.TestClient: dispense: %v", err)
	}
	n, ok := raw.(Notifier)
	if !ok {
		t.Fatalf("notifier.TestClient: dispensed %T, not a Notifier", raw)
	}
	return n
}

package export

import (
	"fmt"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

// TestJaegerLayout: what a trace viewer labels each row with
// ("<service.name> <operation>") names the rank on every span of a rank,
// the operations are few whatever the steps and ranks, and
// OTEL_SERVICE_NAME names the base service.
func TestJaegerLayout(t *testing.T) {
	for _, service := range []string{"", "trainer"} {
		t.Run(fmt.Sprintf("service %q", service), func(t *testing.T) {
			cleanEnv(t)
			base := "ddp-agent"
			if service != "" {
				t.Setenv("OTEL_SERVICE_NAME", service)
				base = service
			}
			rcv := otlptest.Start(t)
			e := start(t, config(rcv.Addr(), 1))
			feed(e, 0)
			e.Fault(0, "test", true)
			shutdown(t, e)

			rows := map[string]int{} // "<service.name> <operation>" → spans
			for _, sp := range rcv.Spans() {
				rows[fmt.Sprint(sp.Resource["service.name"], " ", sp.Name)]++
			}
			want := map[string]int{base + " step": steps, base + " restart": 1,
				fmt.Sprintf("%s rank %d stall", base, slow): 1}
			for r := range ranks {
				want[fmt.Sprintf("%s rank %d allreduce", base, r)] = steps * buckets
			}
			if fmt.Sprint(rows) != fmt.Sprint(want) {
				t.Errorf("rows:\n got %v\nwant %v", rows, want)
			}
			for _, sp := range rcv.Spans() {
				if sp.Resource["service.namespace"] != nil && sp.Resource["service.namespace"] != base {
					t.Errorf("%s: service.namespace %v, want %s", sp.Name, sp.Resource["service.namespace"], base)
				}
			}
		})
	}
}

package export

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// TestWrongProtocol: gRPC spoken to an OTLP/HTTP port, or OTLP/HTTP to a
// gRPC port, is one warning soon after the first export, naming the
// endpoint and the protocol, and not an error at Shutdown.
func TestWrongProtocol(t *testing.T) {
	rcv := otlptest.Start(t)
	tests := []struct {
		name, endpoint, protocol string
	}{
		{"grpc to http", strings.TrimPrefix(rcv.HTTPEndpoint(), "http://"), ProtocolGRPC},
		{"http to grpc", "http://" + rcv.Addr(), ProtocolHTTP},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			var log syncbuf.Buffer
			cfg := config(tc.endpoint, 1)
			cfg.Protocol = tc.protocol
			cfg.StepDelay = 10 * time.Millisecond
			cfg.Logger = slog.New(slog.NewTextHandler(&log, nil))
			e, err := New(t.Context(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			feed(e, 0)
			deadline := time.Now().Add(5 * time.Second) // the batch goes out after 1 s; the warning is due at its first attempt
			for !strings.Contains(log.String(), "otlp export failed") && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
			got := log.String()
			if !strings.Contains(got, "level=WARN msg=\"otlp export failed") || !strings.Contains(got, "protocol="+tc.protocol) ||
				!strings.Contains(got, tc.endpoint) || !strings.Contains(got, "hint=") {
				t.Fatalf("no early warning with endpoint, protocol and hint:\n%s", got)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			if err := e.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			// Once per signal at most: the metrics, read every minute, fail
			// at Shutdown's flush, if their flush gets that far.
			for _, sig := range []string{"traces", "metrics"} {
				if n := strings.Count(log.String(), "signal="+sig); n > 1 || (sig == "traces" && n != 1) {
					t.Errorf("%d %s warnings, want 1:\n%s", n, sig, log.String())
				}
			}
		})
	}
}

func TestHint(t *testing.T) {
	ep := func(proto, hostPort string) endpoint {
		return endpoint{protocol: proto, hostPort: hostPort, insecure: true}
	}
	env := endpoint{protocol: ProtocolGRPC, fromEnv: true, env: "OTEL_EXPORTER_OTLP_ENDPOINT=http://collector:4318"}
	tests := []struct {
		name string
		ep   endpoint
		err  string
		want string // in the hint; "" for none
	}{
		{"grpc on 4318", ep(ProtocolGRPC, "c:4318"), "rpc error: code = Unavailable", "4318 is the OTLP/HTTP port"},
		{"grpc on 4318 from env", env, "rpc error: code = Unavailable", "4318 is the OTLP/HTTP port"},
		{"http on 4317", ep(ProtocolHTTP, "c:4317"), "EOF", "4317 is the OTLP/gRPC port"},
		{"refused", ep(ProtocolGRPC, "c:9"), "dial tcp: connect: connection refused", "nothing listens there"},
		{"grpc to http", ep(ProtocolGRPC, "c:9"), "error reading server preface: http2: frame too large", "does not speak gRPC"},
		{"http to grpc", ep(ProtocolHTTP, "c:9"), `malformed HTTP response "\x00\x00"`, "does not answer OTLP/HTTP"},
		{"http to grpc, reset", ep(ProtocolHTTP, "c:9"), `Post "http://c:9/v1/traces": readfrom tcp a->b: write tcp a->b: write: connection reset by peer`, "does not answer OTLP/HTTP"},
		{"http to grpc, closed under the write", ep(ProtocolHTTP, "c:9"), `Post "http://c:9/v1/traces": readfrom tcp a->b: write tcp a->b: use of closed network connection`, "does not answer OTLP/HTTP"},
		{"metrics to jaeger, grpc", ep(ProtocolGRPC, "c:4317"), "rpc error: code = Unimplemented desc = unknown service opentelemetry.proto.collector.metrics.v1.MetricsService", "OTEL_METRICS_EXPORTER=none"},
		{"metrics to jaeger, http", ep(ProtocolHTTP, "c:4318"), "failed to send metrics to http://c:4318/v1/metrics: 404 Not Found", "OTEL_METRICS_EXPORTER=none"},
		{"traces path not found", ep(ProtocolHTTP, "c:4318"), "failed to send to http://c:4318/x/v1/traces: 404 Not Found", "check the URL path"},
		{"other", ep(ProtocolGRPC, "c:9"), "permission denied", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := hint(tc.ep, errors.New(tc.err))
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("got %q, want one with %q", got, tc.want)
			}
		})
	}
}

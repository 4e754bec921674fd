package export

import (
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/otlptest"
)

func TestEnvEndpoint(t *testing.T) {
	tests := []struct {
		name     string
		env      map[string]string // "" is replaced by the receiver's address
		endpoint string
		protocol string
	}{
		{name: "grpc env", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}},
		{name: "grpc traces env", env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "grpc", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}},
		{name: "http env", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}},
		// The specification's default protocol: an endpoint alone is OTLP/HTTP.
		{name: "http env by default", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http"}},
		{name: "http config", endpoint: "http", protocol: ProtocolHTTP},
		{name: "grpc url", endpoint: "grpc url", protocol: ProtocolGRPC},
		{name: "grpc host:port", endpoint: "grpc host:port"},
		{name: "metrics only", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http", "OTEL_TRACES_EXPORTER": "none"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cleanEnv(t)
			rcv := otlptest.Start(t)
			addr := map[string]string{"grpc": "http://" + rcv.Addr(), "grpc url": "http://" + rcv.Addr(), "grpc host:port": rcv.Addr(),
				"http": rcv.HTTPEndpoint()}
			for k, v := range tc.env {
				if a, ok := addr[v]; ok && strings.HasSuffix(k, "_ENDPOINT") {
					v = a
				}
				t.Setenv(k, v)
			}
			cfg := config(addr[tc.endpoint], 1)
			cfg.Protocol = tc.protocol
			e := start(t, cfg)
			feed(e, 0)
			shutdown(t, e)
			want := steps*(1+buckets*ranks) + 1
			if tc.env["OTEL_TRACES_EXPORTER"] == "none" {
				want = 0
			}
			if got := len(rcv.Spans()); got != want {
				t.Errorf("%d spans, want %d", got, want)
			}
			wantMetrics := tc.env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] == ""
			if got := counter(rcv.Metrics(), "ddp.collectives") > 0; got != wantMetrics {
				t.Errorf("metrics received: %v, want %v", got, wantMetrics)
			}
		})
	}
}

func TestNoOTLP(t *testing.T) {
	cleanEnv(t)
	e := start(t, config("", 1))
	if e.tr != nil {
		t.Errorf("OTLP traces without an endpoint")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
	t.Setenv("OTEL_SDK_DISABLED", "true")
	e = start(t, config("", 1))
	if e.tr != nil {
		t.Errorf("OTLP traces with OTEL_SDK_DISABLED")
	}
	feed(e, 0)
	e.Hang(telemetry.Hang{}, nil)
	e.Fault(1, "x", true)
	e.Generation(1)
	shutdown(t, e)
	shutdown(t, e)
	feed(e, 1) // after Shutdown: nothing, no panic
}

func TestBadEndpoint(t *testing.T) {
	tests := []struct {
		endpoint, protocol string
		want               string // in the error
	}{
		{"localhost", "", "missing port"},
		{"ftp://collector:4317", "", `scheme "ftp"`},
		{"http://", "", "want host:port"},
		{":4317", "", "want host:port"},
		{"http://collector:4318?x=1", "", "scheme://host:port"},
		{"collector:4317", "thrift", `protocol "thrift"`},
	}
	for _, tc := range tests {
		t.Run(tc.endpoint, func(t *testing.T) {
			cleanEnv(t)
			cfg := config(tc.endpoint, 1)
			cfg.Protocol = tc.protocol
			_, err := New(t.Context(), cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New: got %v, want an error with %q", err, tc.want)
			}
		})
	}
}

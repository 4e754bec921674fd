package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestSidecarFlags(t *testing.T) {
	env := map[string]string{"DDP_AGENT_PLUGINS": "disk,path=/tmp", "OTEL_EXPORTER_OTLP_PROTOCOL": ""}
	getenv := func(k string) string { return env[k] }
	cfg, _, err := sidecarFlags([]string{"--socket", "/s/x.sock", "--hang-timeout", "30", "--log-dir", "/l",
		"--plugin", "exec,cmd=true", "--job-linger", "5s", "--otel-endpoint", "http://c:4318"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Socket != "/s/x.sock" || cfg.Telemetry.HangTimeout != 30*time.Second || cfg.LogDir != "/l" || cfg.Linger != 5*time.Second ||
		len(cfg.Plugins) != 1 || cfg.Telemetry.OTLPProtocol != "http/protobuf" {
		t.Errorf("got %+v", cfg)
	}
	if cfg, _, _ := sidecarFlags(nil, getenv, io.Discard); len(cfg.Plugins) != 1 || cfg.Plugins[0].Name != "disk" {
		t.Errorf("$DDP_AGENT_PLUGINS without --plugin: %+v", cfg.Plugins)
	}
	if cfg, _, _ := sidecarFlags([]string{"--hang-timeout", "auto"}, getenv, io.Discard); !cfg.Telemetry.HangAuto || cfg.Telemetry.HangTimeout != time.Minute {
		t.Errorf("auto: %+v", cfg)
	}
	if cfg, _, _ := sidecarFlags([]string{"--hang-timeout", "0"}, getenv, io.Discard); cfg.Telemetry.HangTimeout != 0 {
		t.Errorf("0: %+v", cfg)
	}
	for _, bad := range [][]string{
		{"--hang-timeout", "0.5"}, {"--hang-timeout", "soon"}, {"--trace-sample", "2"}, {"--straggler-cost", "1"},
		{"--job-linger", "10ms"}, {"--log-level", "loud"}, {"train.py"}, {"--plugin", "exec,=x"}, {"--nope"},
	} {
		if _, _, err := sidecarFlags(bad, getenv, io.Discard); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
	var out strings.Builder
	if code := run([]string{"help", "sidecar"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "-job-linger") {
		t.Errorf("help sidecar: %d\n%s", code, out.String())
	}
}

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
		{"--job-linger", "10ms"}, {"--metrics-addr", ":99999"}, {"--log-level", "loud"}, {"train.py"}, {"--plugin", "exec,=x"}, {"--nope"},
		{"--otel-endpoint", "nohostport"},
	} {
		if _, _, err := sidecarFlags(bad, getenv, io.Discard); err == nil {
			t.Errorf("%v: accepted", bad)
		}
	}
	var out strings.Builder
	if code := run([]string{"help", "sidecar"}, &out, io.Discard); code != 0 || !strings.Contains(out.String(), "\n  --job-linger VALUE ") {
		t.Errorf("help sidecar: %d\n%s", code, out.String())
	}
}

// TestSidecarFlagStyle: the sidecar's command line reads as run's and
// status's do (torchrun's style), not as Go's flag package would.
func TestSidecarFlagStyle(t *testing.T) {
	getenv := func(string) string { return "" }
	// torchrun's underscore spelling, = or a separate value, seconds
	cfg, _, err := sidecarFlags([]string{"--metrics_addr", "--weird:0", "--job_linger=90", "--log_dir", "/l"}, getenv, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Telemetry.MetricsAddr != "--weird:0" || cfg.Linger != 90*time.Second || cfg.LogDir != "/l" {
		t.Errorf("got metrics %q, linger %v, log dir %q", cfg.Telemetry.MetricsAddr, cfg.Linger, cfg.LogDir)
	}
	// one line for a mistake, exit 2; the help on stdout, exit 0
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--bogus"}, "ddp-agent sidecar: unknown flag --bogus (see ddp-agent help sidecar)\n"},
		{[]string{"-bogus=1"}, "ddp-agent sidecar: unknown flag --bogus (see ddp-agent help sidecar)\n"},
		{[]string{"--metrics-addr"}, "ddp-agent sidecar: flag --metrics-addr needs a value\n"},
		{[]string{"--job-linger", "soon"}, "ddp-agent sidecar: invalid value \"soon\" for flag --job-linger: \"soon\" is not a positive duration (seconds, or like 500ms)\n"},
	} {
		var stdout, stderr strings.Builder
		if code := run(append([]string{"sidecar"}, c.args...), &stdout, &stderr); code != 2 || stdout.Len() != 0 || stderr.String() != c.want {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 2, stderr %q", c.args, code, stdout.String(), stderr.String(), c.want)
		}
	}
	var stdout, stderr strings.Builder
	if code := run([]string{"sidecar", "--help"}, &stdout, &stderr); code != 0 || stderr.Len() != 0 ||
		!strings.HasPrefix(stdout.String(), "Usage: ddp-agent sidecar") || !strings.Contains(stdout.String(), "\n  --plugin VALUE ") {
		t.Errorf("--help: exit %d, stderr %q, stdout:\n%s", code, stderr.String(), stdout.String())
	}
}

package observe

import (
	"flag"
	"io"
	"testing"
	"time"
)

// TestFlags: the one flag helper reads the telemetry block, --hang-timeout
// in each of its forms, and refuses values out of range.
func TestFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want Config
		bad  bool
	}{
		{"defaults", nil, Config{HangTimeout: time.Minute, TraceSample: 0.1, StragglerCost: 0.05}, false},
		{"seconds", []string{"--hang-timeout", "30"}, Config{HangTimeout: 30 * time.Second, TraceSample: 0.1, StragglerCost: 0.05}, false},
		{"auto", []string{"--hang-timeout", "auto"}, Config{HangTimeout: time.Minute, HangAuto: true, TraceSample: 0.1, StragglerCost: 0.05}, false},
		{"off", []string{"--hang-timeout", "0"}, Config{TraceSample: 0.1, StragglerCost: 0.05}, false},
		{"exporter", []string{"--otel-endpoint", "c:4317", "--metrics-addr", ":9464", "--trace-sample", "1", "--straggler-cost", "0.2"},
			Config{HangTimeout: time.Minute, OTelEndpoint: "c:4317", MetricsAddr: ":9464", TraceSample: 1, StragglerCost: 0.2}, false},
		{"hang under a second", []string{"--hang-timeout", "500ms"}, Config{}, true},
		{"hang not a duration", []string{"--hang-timeout", "soon"}, Config{}, true},
		{"sample over 1", []string{"--trace-sample", "2"}, Config{}, true},
		{"cost of 1", []string{"--straggler-cost", "1"}, Config{}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			var got Config
			check := Flags(fs, &got)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := check()
			if (err != nil) != tc.bad {
				t.Fatalf("check: got %v, want an error: %v", err, tc.bad)
			}
			if !tc.bad && got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestCheckMetricsAddr(t *testing.T) {
	for addr, ok := range map[string]bool{
		"": true, ":9464": true, "127.0.0.1:0": true, "[::1]:9464": true, "localhost:65535": true,
		":http":  true, // a service name, as net.Listen takes
		":":      true, // an ephemeral port, as net.Listen takes it
		":99999": false, "localhost": false, "9464": false, ":-1": false,
	} {
		if err := CheckMetricsAddr(addr); (err == nil) != ok {
			t.Errorf("CheckMetricsAddr(%q) = %v, want ok %v", addr, err, ok)
		}
	}
}

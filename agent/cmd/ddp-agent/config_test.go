package main

import (
	"runtime"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
)

// TestRunConfig: the flags the agent acts on reach agent.Config.
func TestRunConfig(t *testing.T) {
	none := func(string) string { return "" }
	cfg, err := launch.Parse([]string{"--nnodes", "2:3", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400",
		"--rdzv-id", "job7", "--rdzv-conf", "join_timeout=30,last_call_timeout=3,keep_alive_interval=2,keep_alive_max_attempt=4",
		"--max-restarts", "5", "--stop-timeout", "7s", "--log-dir", "/tmp/l", "--tee", "2", "--hang-timeout", "90s",
		"--otel-endpoint", "http://collector:4318", "--trace-sample", "0.5",
		"--straggler-action", "drain", "--straggler-confirm", "2m", "train.py", "--lr", "1"},
		none, launch.Host{CPUs: runtime.NumCPU()})
	if err != nil {
		t.Fatal(err)
	}
	got := runConfig(cfg, none)
	r := got.Rendezvous
	checks := []struct {
		name      string
		got, want any
	}{
		{"run id", got.RunID, "job7"},
		{"command", len(got.Command) > 0 && got.Command[len(got.Command)-1] == "1", true},
		{"nproc", got.NProcPerNode, 2},
		{"max restarts", got.MaxRestarts, 5},
		{"stop timeout", got.StopTimeout, 7 * time.Second},
		{"log dir", got.LogDir, "/tmp/l"},
		{"keep logs (--tee)", got.KeepLogs, true},
		{"streams file for stderr", got.Streams(0).FileErr, true},
		{"backend", r.Backend, join.Hosted},
		{"endpoints", len(r.Endpoints) == 1 && r.Endpoints[0] == "node0:29400", true},
		{"nnodes", [2]int{r.NNodesMin, r.NNodesMax}, [2]int{2, 3}},
		{"join timeout", r.JoinTimeout, 30 * time.Second},
		{"last call", r.LastCall, 3 * time.Second},
		{"ttl", r.TTL, 8 * time.Second},
		{"hang timeout", got.Telemetry.HangTimeout, 90 * time.Second},
		{"trace sample", got.Telemetry.TraceSample, 0.5},
		{"otlp protocol", got.Telemetry.OTLPProtocol, export.ProtocolHTTP},
		{"straggler action", got.Telemetry.StragglerAction, straggler.ActionDrain},
		{"straggler confirm", got.Telemetry.StragglerConfirm, 2 * time.Minute},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s: got %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestRdzvBackend: the flags choose one backend.
func TestRdzvBackend(t *testing.T) {
	none := func(string) string { return "" }
	tests := []struct {
		name string
		args []string
		want join.Backend
	}{
		{"standalone", []string{"--standalone"}, join.Standalone},
		{"one node, no endpoint", []string{"--nnodes", "1"}, join.Static},
		{"static with ranks", []string{"--rdzv-backend", "static", "--nnodes", "2", "--node-rank", "1", "--master-addr", "node0"}, join.Static},
		{"c10d", []string{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400"}, join.Hosted},
		{"c10d, not the host", []string{"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", "node0:29400", "--rdzv-conf", "is_host=false"}, join.Hosted},
		{"etcd", []string{"--nnodes", "2", "--rdzv-backend", "etcd", "--rdzv-endpoint", "etcd0:2379"}, join.External},
		{"etcd-v2", []string{"--nnodes", "2", "--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "etcd0:2379"}, join.External},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := launch.Parse(append(tc.args, "train.py"), none, launch.Host{CPUs: runtime.NumCPU()})
			if err != nil {
				t.Fatal(err)
			}
			if got := runConfig(cfg, none).Rendezvous.Backend; got != tc.want {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// TestOTLPProtocol: an http(s):// endpoint means OTLP/HTTP unless the
// OTEL_* variables choose.
func TestOTLPProtocol(t *testing.T) {
	env := func(k, v string) func(string) string {
		return func(name string) string {
			if name == k {
				return v
			}
			return ""
		}
	}
	tests := []struct {
		name     string
		endpoint string
		getenv   func(string) string
		want     string
	}{
		{"host:port", "collector:4317", env("", ""), ""},
		{"http URL", "http://collector:4318", env("", ""), export.ProtocolHTTP},
		{"https URL", "https://collector:4318", env("", ""), export.ProtocolHTTP},
		{"the variable chooses", "http://collector:4318", env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"), ""},
		{"the traces variable chooses", "http://collector:4318", env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "grpc"), ""},
		{"none", "", env("", ""), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := otlpProtocol(tc.endpoint, tc.getenv); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

// TestSparesServeTheStore: --spares gives the agent the spares' command
// and the store's, whose process outlives rank 0; without it rank 0
// serves the store, as under torchrun's plain env://.
func TestSparesServeTheStore(t *testing.T) {
	none := func(string) string { return "" }
	for _, tc := range []struct {
		args   []string
		spares bool
	}{{[]string{"--standalone", "train.py"}, false}, {[]string{"--standalone", "--spares", "1", "train.py"}, true}} {
		cfg, err := launch.Parse(tc.args, none, launch.Host{CPUs: runtime.NumCPU()})
		if err != nil {
			t.Fatal(err)
		}
		got := runConfig(cfg, none)
		if (len(got.SpareCommand) > 0) != tc.spares || (len(got.StoreCommand) > 0) != tc.spares {
			t.Errorf("%v: spare command %q, store command %q; want both set: %v", tc.args, got.SpareCommand, got.StoreCommand, tc.spares)
		}
	}
}

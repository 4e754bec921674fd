package launch

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

func TestStreams(t *testing.T) {
	all, out, err := StdAll, StdOut, StdErr
	tests := []struct {
		name      string
		logDir    string
		redirects StdSpec
		tee       StdSpec
		logging   bool
		rank      int
		want      supervisor.Streams
	}{
		{name: "console only", want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true}},
		{name: "log dir tees everything", logDir: "/l", logging: true,
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileOut: true, FileErr: true}},
		{name: "redirect all", logDir: "/l", logging: true, redirects: StdSpec{All: all},
			want: supervisor.Streams{FileOut: true, FileErr: true}},
		{name: "redirect stdout of rank 1 only", logging: true, redirects: StdSpec{PerRank: map[int]Std{1: out}}, rank: 1,
			want: supervisor.Streams{ConsoleErr: true, FileOut: true}},
		{name: "per-rank setting leaves rank 0 alone", logging: true, redirects: StdSpec{PerRank: map[int]Std{1: out}}, rank: 0,
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true}},
		{name: "tee stderr without log dir", logging: true, tee: StdSpec{All: err},
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileErr: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &Config{LogDir: tc.logDir, Redirects: tc.redirects, Tee: tc.tee}
			if got := cfg.streams(tc.logging)(tc.rank); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// --local-ranks-filter and --log-line-prefix-template, parsed and mapped:
// a rank left out keeps its files but leaves the console.
func TestConsoleFlags(t *testing.T) {
	c, err := Parse(strings.Fields("--nproc-per-node 3 --log-dir /l --local-ranks-filter 0,2 --log-line-prefix-template [${hostname}:${rank}] train.py"), noEnv, fourCPUs)
	if err != nil {
		t.Fatal(err)
	}
	streams := c.Streams()
	for lr, shown := range []bool{true, false, true} {
		got := streams(lr)
		if got.ConsoleOut != shown || got.ConsoleErr != shown || !got.FileOut || !got.FileErr || got.Prefix != "[${hostname}:${rank}]" {
			t.Errorf("local rank %d: got %+v, want console %v, both files, the template", lr, got, shown)
		}
	}
	for _, bad := range []string{"--local-ranks-filter 0,x train.py", "--local-ranks-filter -1 train.py"} {
		if _, err := Parse(strings.Fields(bad), noEnv, fourCPUs); err == nil || !strings.Contains(err.Error(), "--local-ranks-filter") {
			t.Errorf("%s: got %v, want a --local-ranks-filter error", bad, err)
		}
	}
}

// torchrun 2.x's --shutdown-timeout is --stop-timeout; its Python-only
// flags are accepted at their defaults and refused with the reason.
func TestTorchrun2Flags(t *testing.T) {
	c, err := Parse(strings.Fields("--shutdown-timeout 30 --event-log-handler console train.py"), noEnv, fourCPUs)
	if err != nil {
		t.Fatal(err)
	}
	if c.StopTimeout != 30*time.Second {
		t.Errorf("--shutdown-timeout 30: stop timeout %v", c.StopTimeout)
	}
	for args, want := range map[string]string{
		"--shutdown-timeout 5 --stop-timeout 5s train.py": "give one of them",
		"--shutdown-timeout soon train.py":                "--shutdown-timeout must be a duration",
		"--event-log-handler dynamic train.py":            "Accepted: null, console",
		"--logs-specs mine train.py":                      "LogsSpecs are Python plugins",
	} {
		_, err := Parse(strings.Fields(args), noEnv, fourCPUs)
		var uerr *UsageError
		if !errors.As(err, &uerr) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want a usage error with %q", args, err, want)
		}
	}
}

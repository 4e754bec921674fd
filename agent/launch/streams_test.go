package launch

import (
	"testing"

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
			if got := cfg.streams(tc.logging)(tc.rank); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

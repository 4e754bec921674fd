package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/launch"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

func testAgent(cfg *launch.Config) *Agent {
	return New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), supervisor.NewConsole(io.Discard), supervisor.NewConsole(io.Discard), nil)
}

func TestStreams(t *testing.T) {
	all, out, err := launch.StdAll, launch.StdOut, launch.StdErr
	tests := []struct {
		name      string
		logDir    string
		redirects launch.StdSpec
		tee       launch.StdSpec
		logging   bool
		rank      int
		want      supervisor.Streams
	}{
		{name: "console only", want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true}},
		{name: "log dir tees everything", logDir: "/l", logging: true,
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileOut: true, FileErr: true}},
		{name: "redirect all", logDir: "/l", logging: true, redirects: launch.StdSpec{All: all},
			want: supervisor.Streams{FileOut: true, FileErr: true}},
		{name: "redirect stdout of rank 1 only", logging: true, redirects: launch.StdSpec{PerRank: map[int]launch.Std{1: out}}, rank: 1,
			want: supervisor.Streams{ConsoleErr: true, FileOut: true}},
		{name: "per-rank setting leaves rank 0 alone", logging: true, redirects: launch.StdSpec{PerRank: map[int]launch.Std{1: out}}, rank: 0,
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true}},
		{name: "tee stderr without log dir", logging: true, tee: launch.StdSpec{All: err},
			want: supervisor.Streams{ConsoleOut: true, ConsoleErr: true, FileErr: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a := testAgent(&launch.Config{LogDir: tc.logDir, Redirects: tc.redirects, Tee: tc.tee})
			if got := a.streams(tc.logging)(tc.rank); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestRunDirNeverReused(t *testing.T) {
	logDir := t.TempDir()
	a := testAgent(&launch.Config{LogDir: logDir})
	var dirs []string
	for i := 0; i < 3; i++ {
		d, keep, err := a.runDir("job")
		if err != nil || !keep {
			t.Fatalf("runDir: %q, keep %v, %v", d, keep, err)
		}
		dirs = append(dirs, filepath.Base(d))
	}
	if want := []string{"job", "job_1", "job_2"}; dirs[0] != want[0] || dirs[1] != want[1] || dirs[2] != want[2] {
		t.Errorf("got %v, want %v", dirs, want)
	}
	tmp := testAgent(&launch.Config{})
	d, keep, err := tmp.runDir("job")
	if err != nil || keep {
		t.Fatalf("runDir without log dir: %q keep %v, %v; want a temporary dir", d, keep, err)
	}
	os.RemoveAll(d)
}

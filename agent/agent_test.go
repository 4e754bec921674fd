package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

func testAgent(cfg Config) *Agent {
	return New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)), supervisor.NewConsole(io.Discard), supervisor.NewConsole(io.Discard), nil)
}

func TestRunDirNeverReused(t *testing.T) {
	logDir := t.TempDir()
	a := testAgent(Config{LogDir: logDir})
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
	tmp := testAgent(Config{})
	d, keep, err := tmp.runDir("job")
	if err != nil || keep {
		t.Fatalf("runDir without log dir: %q keep %v, %v; want a temporary dir", d, keep, err)
	}
	os.RemoveAll(d)
}

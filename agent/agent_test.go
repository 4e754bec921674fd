package agent

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
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
		d, err := a.runDir("job")
		if err != nil || !d.Keep {
			t.Fatalf("runDir: %+v, %v", d, err)
		}
		dirs = append(dirs, filepath.Base(d.Path))
	}
	if want := []string{"job", "job_1", "job_2"}; dirs[0] != want[0] || dirs[1] != want[1] || dirs[2] != want[2] {
		t.Errorf("got %v, want %v", dirs, want)
	}
	tmp := testAgent(Config{})
	d, err := tmp.runDir("job")
	if err != nil || d.Keep {
		t.Fatalf("runDir without log dir: %+v, %v; want a temporary dir", d, err)
	}
	if err := d.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d.Path); !os.IsNotExist(err) {
		t.Errorf("%s still there after Remove (%v)", d.Path, err)
	}
}

// TestConfigCheck: Run refuses a configuration it cannot run instead of
// failing deep inside (the command line never builds one).
func TestConfigCheck(t *testing.T) {
	ok := Config{Command: []string{"python3", "t.py"}, NProcPerNode: 1, Rendezvous: Rendezvous{NNodesMin: 1, NNodesMax: 1}}
	tests := []struct {
		name   string
		change func(*Config)
		bad    bool
	}{
		{"ok", func(*Config) {}, false},
		{"no command", func(c *Config) { c.Command = nil }, true},
		{"no workers", func(c *Config) { c.NProcPerNode = 0 }, true},
		{"min over max", func(c *Config) { c.Rendezvous.NNodesMin = 2 }, true},
		{"dynamic without endpoints", func(c *Config) { c.Rendezvous.Backend = join.Hosted }, true},
		{"standalone needs no endpoints", func(c *Config) { c.Rendezvous.Backend = join.Standalone }, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			tc.change(&c)
			if err := c.check(); (err != nil) != tc.bad {
				t.Errorf("check: %v, want an error: %v", err, tc.bad)
			}
			if tc.bad {
				if err := testAgent(c).Run(t.Context()); err == nil {
					t.Error("Run accepted it")
				}
			}
		})
	}
}

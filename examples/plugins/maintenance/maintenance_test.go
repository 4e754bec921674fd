package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// Every call goes through the SDK's gRPC glue, as from the agent.
func newClient(t *testing.T, cfg plugins.Config) detector.Detector {
	t.Helper()
	d := detector.TestClient(t, &maintenance{})
	sched, err := d.Configure(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sched.Every <= 0 {
		t.Fatalf("schedule %+v", sched)
	}
	return d
}

// next returns the detector's next n verdicts.
func next(t *testing.T, d detector.Detector, n int) []detector.Finding {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []detector.Finding
	watchCtx, stop := context.WithCancel(ctx)
	defer stop()
	_ = d.Watch(watchCtx, func(f detector.Finding) error {
		if got = append(got, f); len(got) == n {
			stop()
		}
		return nil
	})
	if len(got) < n {
		t.Fatalf("%d verdicts, want %d", len(got), n)
	}
	return got
}

func TestNoFileIsHealthy(t *testing.T) {
	file := filepath.Join(t.TempDir(), "maintenance")
	f := next(t, newClient(t, plugins.Config{"file": file}), 1)[0]
	if f.Severity != detector.SeverityOK || f.Action != detector.ActionNone || f.Subject != file {
		t.Errorf("verdict %+v", f)
	}
}

func TestFileDrainsTheNode(t *testing.T) {
	file := filepath.Join(t.TempDir(), "maintenance")
	if err := os.WriteFile(file, []byte("BIOS update, ticket 4711\nsecond line\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	f := next(t, newClient(t, plugins.Config{"file": file}), 1)[0]
	if f.Severity != detector.SeverityError || f.Action != detector.ActionDrainNode || f.Message != "node in maintenance: BIOS update, ticket 4711" {
		t.Errorf("verdict %+v", f)
	}
}

// TestFileAppears: the verdict follows the file from one look to the next.
func TestFileAppears(t *testing.T) {
	file := filepath.Join(t.TempDir(), "maintenance")
	d := newClient(t, plugins.Config{"file": file, "interval": "20ms"})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var actions []detector.Action
	_ = d.Watch(ctx, func(f detector.Finding) error {
		actions = append(actions, f.Action)
		if len(actions) == 1 {
			if err := os.WriteFile(file, nil, 0o644); err != nil {
				t.Error(err)
			}
		}
		if f.Action == detector.ActionDrainNode {
			cancel()
		}
		return nil
	})
	if actions[0] != detector.ActionNone || actions[len(actions)-1] != detector.ActionDrainNode {
		t.Errorf("actions %v, want none first and drain-node once the file exists", actions)
	}
}

func TestUnreadableFileWarns(t *testing.T) {
	dir := t.TempDir() // a directory cannot be read as a file
	f := next(t, newClient(t, plugins.Config{"file": dir}), 1)[0]
	if f.Severity != detector.SeverityWarning || f.Action != detector.ActionWarn || !strings.Contains(f.Message, "cannot read") {
		t.Errorf("verdict %+v", f)
	}
}

func TestConfigureRefusals(t *testing.T) {
	d := detector.TestClient(t, &maintenance{})
	for want, cfg := range map[string]plugins.Config{
		`option interval="never"`: {"interval": "never"},
		`unknown option "path"`:   {"path": "/x"},
	} {
		if _, err := d.Configure(context.Background(), cfg); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Configure(%v) = %v, want %q", cfg, err, want)
		}
	}
	sched, err := d.Configure(context.Background(), nil)
	if err != nil || sched.Every != 10*time.Second {
		t.Errorf("defaults: %+v, %v", sched, err)
	}
}

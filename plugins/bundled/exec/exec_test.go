package exec_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/bundled/exec"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestConfigure(t *testing.T) {
	d := detector.TestClient(t, exec.New())
	ctx := context.Background()
	for _, tc := range []struct {
		cfg   plugins.Config
		every time.Duration
		err   string
	}{
		{plugins.Config{"command": "true"}, 40 * time.Second, ""},
		{plugins.Config{"command": "true", "interval": "1m", "timeout": "5s"}, 65 * time.Second, ""},
		{plugins.Config{}, 0, `option "command" is required`},
		{plugins.Config{"command": "true", "interval": "soon"}, 0, `option interval="soon"`},
		{plugins.Config{"command": "true", "timeout": "0s"}, 0, `option timeout="0s"`},
		{plugins.Config{"command": "true", "retries": "3"}, 0, `unknown option "retries"`},
	} {
		sched, err := d.Configure(ctx, tc.cfg)
		switch {
		case tc.err == "" && (err != nil || sched.Every != tc.every):
			t.Errorf("Configure(%v) = %v, %v; want every %v", tc.cfg, sched, err, tc.every)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("Configure(%v) = %v; want an error saying %q", tc.cfg, err, tc.err)
		}
	}
}

func TestInfo(t *testing.T) {
	info, err := detector.TestClient(t, exec.New()).Info(context.Background())
	if err != nil || info.Name != "exec" || info.Kind != plugins.KindDetector || len(info.Options) != 3 {
		t.Fatalf("Info = %+v, %v", info, err)
	}
}

// TestWatch: the first check runs at once, the next ones interval apart,
// each verdict crosses the wire, and Watch ends with its ctx.
func TestWatch(t *testing.T) {
	d := detector.TestClient(t, exec.New())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := d.Configure(ctx, plugins.Config{"command": "echo tick; exit 1", "interval": "50ms"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var got []detector.Finding
	watchCtx, stop := context.WithCancel(ctx)
	err := d.Watch(watchCtx, func(f detector.Finding) error {
		if got = append(got, f); len(got) == 3 {
			stop()
		}
		return nil
	})
	if err != nil && watchCtx.Err() == nil {
		t.Fatalf("Watch = %v", err)
	}
	if len(got) < 3 {
		t.Fatalf("%d findings", len(got))
	}
	for _, f := range got {
		if f.Severity != detector.SeverityWarning || f.Action != detector.ActionWarn || f.Message != "tick" {
			t.Errorf("finding %+v", f)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("3 checks 50ms apart took %v", took)
	}
}

func TestFirstCheckAtOnce(t *testing.T) {
	d := detector.TestClient(t, exec.New())
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := d.Configure(ctx, plugins.Config{"command": "exit 0", "interval": "1h"}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	watchCtx, stop := context.WithCancel(ctx)
	_ = d.Watch(watchCtx, func(detector.Finding) error { stop(); return nil })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the first verdict came after %v", took)
	}
}

func TestWatchBeforeConfigure(t *testing.T) {
	err := exec.New().Watch(context.Background(), func(detector.Finding) error { return nil })
	if err == nil || !strings.Contains(err.Error(), "before Configure") {
		t.Fatalf("Watch = %v", err)
	}
}

package detector_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// fake is a detector whose every answer the test sets.
type fake struct {
	info      plugins.Info
	sched     detector.Schedule
	cfgErr    error
	gotCfg    chan plugins.Config
	findings  []detector.Finding
	hold      bool  // after the findings, wait for ctx to end
	watchErr  error // returned after the findings when !hold
	watchDone chan error
}

func newFake() *fake {
	return &fake{
		info: plugins.Info{
			Name: "fake", Kind: plugins.KindDetector, Version: "1.2.3", Summary: "a test's detector",
			Options: []plugins.Option{
				{Name: "path", Default: "/scratch", Help: "where to look"},
				{Name: "token", Help: "a secret", Required: true},
			},
		},
		sched:     detector.Schedule{Every: 1500 * time.Millisecond},
		gotCfg:    make(chan plugins.Config, 1),
		watchDone: make(chan error, 1),
	}
}

func (f *fake) Info(context.Context) (plugins.Info, error) { return f.info, nil }

func (f *fake) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	f.gotCfg <- cfg
	return f.sched, f.cfgErr
}

func (f *fake) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	err := f.watch(ctx, emit)
	f.watchDone <- err
	return err
}

func (f *fake) watch(ctx context.Context, emit func(detector.Finding) error) error {
	for _, fd := range f.findings {
		if err := emit(fd); err != nil {
			return err
		}
	}
	if !f.hold {
		return f.watchErr
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestInfoAndConfigureRoundTrip(t *testing.T) {
	f := newFake()
	d := detector.TestClient(t, f)
	ctx := context.Background()
	info, err := d.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(info, f.info) {
		t.Errorf("Info = %+v, want %+v", info, f.info)
	}
	cfg := plugins.Config{"path": "/tmp/x", "token": "a,b=c"}
	sched, err := d.Configure(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if sched != f.sched {
		t.Errorf("Schedule = %+v, want %+v", sched, f.sched)
	}
	if got := <-f.gotCfg; !reflect.DeepEqual(got, cfg) {
		t.Errorf("the plugin got %v, want %v", got, cfg)
	}
}

func TestConfigureErrorIsThePluginsWords(t *testing.T) {
	f := newFake()
	f.cfgErr = errors.New(`plugin fake: option "token" is required`)
	_, err := detector.TestClient(t, f).Configure(context.Background(), nil)
	if err == nil || err.Error() != f.cfgErr.Error() {
		t.Fatalf("Configure error = %v, want %q", err, f.cfgErr)
	}
}

func TestInfoRefusesAnUnknownKind(t *testing.T) {
	f := newFake()
	f.info.Kind = "detektor"
	_, err := detector.TestClient(t, f).Info(context.Background())
	if err == nil || !strings.Contains(err.Error(), `kind "detektor"`) {
		t.Fatalf("Info error = %v, want one naming the kind", err)
	}
}

func TestWatchStreamsEveryField(t *testing.T) {
	f := newFake()
	at := time.Date(2026, 11, 26, 3, 4, 5, 123456789, time.UTC)
	f.findings = []detector.Finding{
		{Subject: "node", Severity: detector.SeverityOK, Action: detector.ActionNone, Message: "ok"},
		{Subject: "eth0", Severity: detector.SeverityWarning, Action: detector.ActionWarn, Message: "link flaps", Time: at},
		{Subject: "GPU-1234", Severity: detector.SeverityError, Action: detector.ActionRestartWorkers, Message: "xid 79", Time: at.Add(time.Nanosecond)},
		{Subject: "/scratch", Severity: detector.SeverityError, Action: detector.ActionDrainNode, Message: "disk full", Time: at.Add(time.Hour)},
	}
	got, err := watchAll(t, detector.TestClient(t, f))
	if err != nil {
		t.Fatalf("Watch = %v, want nil once the plugin ends its stream", err)
	}
	if len(got) != len(f.findings) {
		t.Fatalf("got %d findings, want %d", len(got), len(f.findings))
	}
	for i, want := range f.findings {
		g := got[i]
		if g.Subject != want.Subject || g.Severity != want.Severity || g.Action != want.Action || g.Message != want.Message || !g.Time.Equal(want.Time) || g.Time.IsZero() != want.Time.IsZero() {
			t.Errorf("finding %d = %+v, want %+v", i, g, want)
		}
	}
}

func watchAll(t *testing.T, d detector.Detector) ([]detector.Finding, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var got []detector.Finding
	err := d.Watch(ctx, func(f detector.Finding) error { got = append(got, f); return nil })
	return got, err
}

func TestWatchEndsWithCtx(t *testing.T) {
	f := newFake()
	f.findings = []detector.Finding{{Subject: "node", Severity: detector.SeverityOK, Action: detector.ActionNone}}
	f.hold = true
	d := detector.TestClient(t, f)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	seen := make(chan struct{}, 1)
	go func() {
		done <- d.Watch(ctx, func(detector.Finding) error { seen <- struct{}{}; return nil })
	}()
	<-seen
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Watch = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Watch did not end with its ctx")
	}
	select {
	case <-f.watchDone: // the plugin's Watch saw its ctx end too
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin's Watch went on after the agent cancelled")
	}
}

func TestWatchPluginErrorIsThePluginsWords(t *testing.T) {
	f := newFake()
	f.watchErr = errors.New("scratch disk gone")
	_, err := watchAll(t, detector.TestClient(t, f))
	if err == nil || !strings.Contains(err.Error(), "scratch disk gone") || strings.Contains(err.Error(), "rpc error") {
		t.Fatalf("Watch = %v, want the plugin's error alone", err)
	}
}

func TestWatchEmitErrorStopsThePlugin(t *testing.T) {
	f := newFake()
	f.findings = []detector.Finding{{Subject: "node", Severity: detector.SeverityOK, Action: detector.ActionNone}}
	f.hold = true
	stop := errors.New("agent gone")
	err := detector.TestClient(t, f).Watch(context.Background(), func(detector.Finding) error { return stop })
	if !errors.Is(err, stop) {
		t.Fatalf("Watch = %v, want emit's error", err)
	}
	select {
	case <-f.watchDone:
	case <-time.After(5 * time.Second):
		t.Fatal("the plugin's Watch went on after emit failed")
	}
}

func TestOutOfRangeFindingRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		f    detector.Finding
		want string
	}{
		{"severity", detector.Finding{Severity: 9, Action: detector.ActionWarn}, "severity(9) is not a severity"},
		{"action", detector.Finding{Severity: detector.SeverityWarning, Action: -1}, "action(-1) is not an action"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFake()
			f.findings = []detector.Finding{tc.f}
			got, err := watchAll(t, detector.TestClient(t, f))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Watch = %v, want an error saying %q", err, tc.want)
			}
			if len(got) != 0 {
				t.Errorf("emit got %v", got)
			}
			if perr := <-f.watchDone; perr == nil || !strings.Contains(perr.Error(), tc.want) {
				t.Errorf("the plugin's emit returned %v, want the refusal", perr)
			}
		})
	}
}

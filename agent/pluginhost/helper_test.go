package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// The test binary doubles as the plugin the host starts: run with
// helperEnv set (by the wrapper script helperPlugin writes), it serves the
// plugin that variable names, over go-plugin, and never runs tests. The
// host starts it exactly as it starts a site's plugin: its own process,
// the handshake, AutoMTLS, Pdeathsig, a process group.
const (
	helperEnv    = "PLUGINHOST_HELPER"     // the helper's mode, e.g. "detector:steady"
	helperLogEnv = "PLUGINHOST_HELPER_LOG" // a file the helper appends what it did to
)

func TestMain(m *testing.M) {
	if mode := os.Getenv(helperEnv); mode != "" {
		servePluginHelper(mode, os.Args[1:])
		return
	}
	before := runtime.NumGoroutine()
	code := m.Run()
	if code == 0 {
		// Every host in the tests has been closed: nothing of them may run.
		if err := leaktest.CheckCount(before, 10*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.Exit(code)
}

// helperNote appends one line to the helper's log file: what the test
// reads of what happened inside the plugin's process.
func helperNote(format string, args ...any) {
	path := os.Getenv(helperLogEnv)
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, format+"\n", args...)
}

// servePluginHelper is the plugin process. mode is KIND:BEHAVIOUR, or
// bundled:KIND:BEHAVIOUR for a ddp-agent-plugins stand-in (which answers
// --list and takes the plugin's name as its argument).
func servePluginHelper(mode string, args []string) {
	if rest, ok := strings.CutPrefix(mode, "bundled:"); ok {
		if len(args) > 0 && args[0] == "--list" {
			fmt.Println("helper other")
			return
		}
		mode = rest
	}
	switch mode {
	case "exit": // exits before any handshake
		fmt.Fprintln(os.Stderr, "exiting before the handshake")
		os.Exit(3)
	case "stdout": // writes something else than a handshake
		fmt.Println("hello, not a handshake")
		os.Exit(0)
	}
	helperNote("start %d", os.Getpid())
	kind, behaviour, _ := strings.Cut(mode, ":")
	if kind == "notifier" {
		notifier.Serve(&helperNotifier{behaviour: behaviour})
		return
	}
	detector.Serve(&helperDetector{behaviour: behaviour})
}

var helperOptions = []plugins.Option{{Name: "message"}, {Name: "every", Default: "20ms"}, {Name: "action"}}

type helperDetector struct {
	behaviour string
	message   string
	every     time.Duration
	action    detector.Action
}

func (d *helperDetector) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{Name: "helper", Kind: plugins.KindDetector, Version: "0.0.1", Summary: "the tests' detector", Options: helperOptions}, nil
}

func (d *helperDetector) Configure(_ context.Context, cfg plugins.Config) (detector.Schedule, error) {
	if d.behaviour == "refuse" {
		return detector.Schedule{}, errors.New("message: not a value this plugin takes")
	}
	every, err := time.ParseDuration(cfg.Get("every", "20ms"))
	if err != nil {
		return detector.Schedule{}, err
	}
	d.message, d.every = cfg.Get("message", "all is well"), every
	if cfg.Get("action", "") == "restart" {
		d.action = detector.ActionRestartWorkers
	}
	return detector.Schedule{Every: every}, nil
}

func (d *helperDetector) Watch(ctx context.Context, emit func(detector.Finding) error) error {
	f := detector.Finding{Severity: detector.SeverityOK, Message: d.message}
	if d.action >= detector.ActionRestartWorkers {
		f.Severity = detector.SeverityError
	}
	f.Action = d.action
	if err := emit(f); err != nil {
		return err
	}
	switch d.behaviour {
	case "silent": // one verdict, then nothing: hung
		<-ctx.Done()
		return ctx.Err()
	case "endwatch": // returns from Watch though the agent did not ask
		return nil
	case "crash":
		// As a plugin writes its last words: os.Stderr and the log
		// package, then exit (go-plugin's Serve points os.Stderr at a
		// stream that dies with the process; the SDK's puts it back).
		fmt.Fprintln(os.Stderr, "crashing on purpose")
		log.Print("the log package's last line")
		os.Exit(2)
	}
	t := time.NewTicker(d.every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			if err := emit(f); err != nil {
				return err
			}
		}
	}
}

type helperNotifier struct{ behaviour string }

func (n *helperNotifier) Info(context.Context) (plugins.Info, error) {
	return plugins.Info{Name: "helper", Kind: plugins.KindNotifier, Version: "0.0.1", Summary: "the tests' notifier", Options: helperOptions}, nil
}

func (n *helperNotifier) Configure(context.Context, plugins.Config) error {
	if n.behaviour == "refuse" {
		return errors.New("url: not a value this plugin takes")
	}
	return nil
}

func (n *helperNotifier) Notify(ctx context.Context, ev notifier.Event) error {
	switch n.behaviour {
	case "fail":
		return errors.New("the site's pager is down")
	case "stuck": // never answers, whatever the deadline
		select {}
	case "deadline":
		// Its side of the deadline passes first (its clock, a timeout of
		// its own): DEADLINE_EXCEEDED comes back while the agent's ctx
		// still runs, as it often does for a stuck one.
		return context.DeadlineExceeded
	}
	helperNote("event %s %s", ev.Kind, ev.Message)
	helperNote("attempt %s %d %d", ev.Kind, ev.Generation, ev.Attempt)
	return nil
}

// helperPlugin writes an executable that runs the test binary as the
// plugin of mode, and returns its path and the file the plugin notes to.
// name is the file's name: the Spec's Name for an external plugin, or
// BundledBinary for a ddp-agent-plugins stand-in.
func helperPlugin(t *testing.T, dir, name, mode string) (path, notes string) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	path, notes = filepath.Join(dir, name), filepath.Join(dir, name+".notes")
	script := fmt.Sprintf("#!/bin/sh\n%s='%s' %s='%s' exec '%s' \"$@\"\n", helperEnv, mode, helperLogEnv, notes, exe)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path, notes
}

// noteLines reads what the helper processes noted with the prefix.
func noteLines(notes, prefix string) []string {
	b, _ := os.ReadFile(notes)
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// eventually waits, up to 20 s, for cond: something another process does.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(20 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("waited 20s for %s", what)
		}
	}
}

// record is one line the host logged.
type record struct {
	level slog.Level
	msg   string
	attrs map[string]string
}

func (r record) String() string { return r.level.String() + " " + r.msg }

// recorder is a slog handler that keeps the host's log lines for the test
// and lets it wait for one.
type recorder struct {
	mu      sync.Mutex
	recs    []record
	changed chan struct{} // closed, and replaced, at each new record
}

func newRecorder() *recorder { return &recorder{changed: make(chan struct{})} }

func (r *recorder) logger() *slog.Logger { return slog.New(recordHandler{r: r}) }

// lines returns the records whose message is msg ("" for all).
func (r *recorder) lines(msg string) []record {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []record
	for _, rec := range r.recs {
		if msg == "" || rec.msg == msg {
			out = append(out, rec)
		}
	}
	return out
}

// waitFor waits, up to 20 s, until n records with message msg are logged,
// and returns them.
func (r *recorder) waitFor(t *testing.T, msg string, n int) []record {
	t.Helper()
	deadline := time.NewTimer(20 * time.Second)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		ch := r.changed
		r.mu.Unlock()
		if got := r.lines(msg); len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("waited 20s for %d log lines %q; the log:\n%v", n, msg, r.lines(""))
		}
	}
}

type recordHandler struct {
	r     *recorder
	attrs []slog.Attr
}

func (h recordHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h recordHandler) Handle(_ context.Context, rec slog.Record) error {
	m := map[string]string{}
	for _, a := range h.attrs {
		m[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value.String()
		return true
	})
	h.r.mu.Lock()
	defer h.r.mu.Unlock()
	h.r.recs = append(h.r.recs, record{level: rec.Level, msg: rec.Message, attrs: m})
	close(h.r.changed)
	h.r.changed = make(chan struct{})
	return nil
}

func (h recordHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return recordHandler{r: h.r, attrs: append(append([]slog.Attr(nil), h.attrs...), as...)}
}

func (h recordHandler) WithGroup(string) slog.Handler { return h }

// newTestHost is a host as Start builds it, without its plugins: the test
// starts and runs them itself. Close runs when the test ends.
func newTestHost(t *testing.T, cfg Config, log *slog.Logger) *Host {
	t.Helper()
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	h := &Host{cfg: cfg, log: log, ctx: ctx, cancel: cancel}
	h.verdicts = newVerdicts(h)
	t.Cleanup(func() { h.Close(0) })
	return h
}

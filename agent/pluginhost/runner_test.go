package pluginhost

import (
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestRestartDelay(t *testing.T) {
	for _, tc := range []struct {
		name       string
		n          int
		first, max time.Duration
		want       time.Duration
	}{
		{name: "the first failure waits the first backoff", n: 1, first: time.Second, max: 30 * time.Second, want: time.Second},
		{name: "the second doubles it", n: 2, first: time.Second, max: 30 * time.Second, want: 2 * time.Second},
		{name: "the fifth", n: 5, first: time.Second, max: 30 * time.Second, want: 16 * time.Second},
		{name: "capped at the longest", n: 6, first: time.Second, max: 30 * time.Second, want: 30 * time.Second},
		{name: "a longest not a doubling of the first", n: 3, first: 3 * time.Second, max: 10 * time.Second, want: 10 * time.Second},
		// Doubling 200 times unbounded overflows to 0: no wait at all.
		{name: "many failures do not overflow", n: 200, first: time.Second, max: 30 * time.Second, want: 30 * time.Second},
		{name: "a first above the longest", n: 1, first: time.Minute, max: 30 * time.Second, want: 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := restartDelay(tc.n, tc.first, tc.max); got != tc.want {
				t.Errorf("restartDelay(%d, %v, %v): got %v, want %v", tc.n, tc.first, tc.max, got, tc.want)
			}
		})
	}
}

// A detector that crashes after each start is told each time, restarted
// after a backoff that doubles up to MaxBackoff, and its last stderr line
// is in the failure's line.
func TestCrashingPluginBacksOff(t *testing.T) {
	path, notes := helperPlugin(t, t.TempDir(), "crasher", "detector:crash")
	rec := newRecorder()
	h, err := Start(Config{Specs: []Spec{{Name: "crasher", Path: path, Raw: path}},
		FirstBackoff: 10 * time.Millisecond, MaxBackoff: 40 * time.Millisecond}, rec.logger())
	if err != nil {
		t.Fatal(err)
	}
	fails := rec.waitFor(t, "plugin failed; restarting it", 4)
	rec.waitFor(t, "plugin restarted", 3)
	h.Close(0)
	var waits []string
	for _, f := range fails[:4] {
		waits = append(waits, f.attrs["in"])
	}
	if got, want := strings.Join(waits, " "), "10ms 20ms 40ms 40ms"; got != want {
		t.Errorf("backoffs: got %v, want %v", got, want)
	}
	for _, f := range fails[:4] {
		if err := f.attrs["err"]; !strings.Contains(err, "the plugin exited") || !strings.Contains(err, "crashing on purpose") {
			t.Errorf("failure %q, want it to say the plugin exited, with its last stderr", err)
		}
	}
	for i, r := range rec.lines("plugin restarted")[:3] {
		if got, want := r.attrs["after_failures"], []string{"1", "2", "3"}[i]; got != want {
			t.Errorf("restart %d: after_failures got %v, want %v", i, got, want)
		}
	}
	pidsGone(t, notes)
}

// A plugin's last words before it exits (os.Stderr, the log package)
// are in the failure's line, with its exit status, at every crash:
// through go-plugin's stdio stream they were lost most of the time.
func TestCrashingPluginsLastStderr(t *testing.T) {
	path, _ := helperPlugin(t, t.TempDir(), "crasher", "detector:crash")
	rec := newRecorder()
	h, err := Start(Config{Specs: []Spec{{Name: "crasher", Path: path, Raw: path}},
		FirstBackoff: 10 * time.Millisecond, MaxBackoff: 10 * time.Millisecond}, rec.logger())
	if err != nil {
		t.Fatal(err)
	}
	const crashes = 6
	fails := rec.waitFor(t, "plugin failed; restarting it", crashes)
	h.Close(0)
	for i, f := range fails[:crashes] {
		err := f.attrs["err"]
		for _, want := range []string{"the plugin exited (exit status 2)", "crashing on purpose", "the log package's last line"} {
			if !strings.Contains(err, want) {
				t.Errorf("crash %d: failure %q, want it to say %q", i+1, err, want)
			}
		}
	}
}

// A plugin refused after the agent started (replaced by one that refuses
// its options) does not stop the job: it is told once, then tried again
// quietly every MaxBackoff in case it comes back.
func TestRefusedLaterIsToldOnce(t *testing.T) {
	path, notes := helperPlugin(t, t.TempDir(), "refuser", "detector:refuse")
	rec := newRecorder()
	h := newTestHost(t, Config{FirstBackoff: 10 * time.Millisecond, MaxBackoff: 20 * time.Millisecond}, rec.logger())
	r := newRunner(h, Spec{Name: "refuser", Path: path, Raw: path})
	h.runners = []*runner{r}
	h.goRun(func() { r.run(nil, detector.Schedule{}, nil) })
	// Three starts are at least two retries after the first refusal.
	eventually(t, "three starts", func() bool { return len(noteLines(notes, "start ")) >= 3 })
	h.Close(0)
	fails := rec.lines("plugin failed; restarting it")
	if len(fails) != 1 {
		t.Fatalf("%d failure lines, want 1 for the same refusal:\n%v", len(fails), fails)
	}
	if got, want := fails[0].attrs["in"], "20ms"; got != want {
		t.Errorf("retry in: got %v, want %v (MaxBackoff, not the first backoff)", got, want)
	}
	if got := fails[0].attrs["err"]; !strings.Contains(got, "refused: message: not a value this plugin takes") {
		t.Errorf("got %q, want the plugin's refusal", got)
	}
	// The runner queued the plugin_failed event for itself (its kind is
	// not known yet: it never served): once.
	if got := len(r.q); got != 1 {
		t.Errorf("events told: got %v, want 1", got)
	}
	pidsGone(t, notes)
}

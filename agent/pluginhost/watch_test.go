package pluginhost

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// watch's verdict on a real detector process: hung when silent for
// 2 × Every + HangGrace, not while its verdicts keep coming, and a
// plugin that ends its watch or exits is told apart.
func TestWatch(t *testing.T) {
	for _, tc := range []struct {
		name  string
		mode  string
		every string        // the detector's promised Schedule.Every
		grace time.Duration // Config.HangGrace
		until time.Duration // for a watch that goes on: the host closes after this much of it
		want  string        // the error, "" for none
	}{
		{name: "silent after its first verdict", mode: "detector:silent", every: "20ms", grace: 100 * time.Millisecond,
			want: "hung: no verdict for"},
		{name: "the hung error names the promise", mode: "detector:silent", every: "30ms", grace: 10 * time.Millisecond,
			want: "it promised one every 30ms"},
		// Verdicts every 20 ms for 2.5 s, over twice the 1.04 s limit: a
		// watch that did not reset its clock at each verdict is hung by then.
		{name: "verdicts as promised are not a hang", mode: "detector:steady", every: "20ms", grace: time.Second,
			until: 2500 * time.Millisecond},
		{name: "it ended its watch", mode: "detector:endwatch", every: "20ms", grace: time.Minute,
			want: "the plugin ended its watch"},
		{name: "it exited", mode: "detector:crash", every: "20ms", grace: time.Minute,
			want: "the plugin exited"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, _ := helperPlugin(t, t.TempDir(), "det", tc.mode)
			sp := Spec{Name: "det", Path: path, Raw: path, Config: plugins.Config{"every": tc.every, "action": "restart"}}
			found := make(chan Finding, 1024)
			h := newTestHost(t, Config{HangGrace: tc.grace, OnFinding: func(f Finding) {
				select {
				case found <- f:
				default:
				}
			}}, newRecorder().logger())
			p, sched, err := h.start(h.ctx, sp)
			if err != nil {
				t.Fatal(err)
			}
			defer p.kill()
			done := make(chan error, 1)
			go func() { done <- h.watch(sp, p, sched) }()
			if tc.until > 0 {
				<-found
				for first := time.Now(); time.Since(first) < tc.until; {
					select {
					case <-found:
					case err := <-done:
						t.Fatalf("watch ended after %v of verdicts: %v", time.Since(first), err)
					}
				}
				h.cancel()
			}
			var got error
			select {
			case got = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("watch did not return in 20s")
			}
			switch {
			case tc.want == "" && got != nil:
				t.Errorf("got %v, want nil", got)
			case tc.want != "" && (got == nil || !strings.Contains(got.Error(), tc.want)):
				t.Errorf("got %v, want an error with %q", got, tc.want)
			}
			var hung *hungError
			if isHung := errors.As(got, &hung); isHung != strings.HasPrefix(tc.want, "hung") && !strings.Contains(tc.want, "promised") {
				t.Errorf("got %T, hung %v", got, isHung)
			}
		})
	}
}

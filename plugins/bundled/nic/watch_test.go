package nic

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// A read that hangs (a wedged driver) turns into a warning for its port
// within readTimeout, and the other ports are still judged.
func TestWatcherHungRead(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	read := func(_ string, p port) portState {
		if p.Name == "eth1" {
			<-release
		}
		return portState{Present: true, Up: true, State: "operstate up, carrier", Changes: 1, RateMbps: 100}
	}
	w := newWatcher(config{sysfs: "/x"}, []port{netPort("eth0"), netPort("eth1")}, read)
	start := time.Now()
	got := w.check(context.Background())
	if d := time.Since(start); d > readTimeout+time.Second {
		t.Errorf("check took %s with a hung read, want about readTimeout (%s)", d, readTimeout)
	}
	if len(got) != 2 || got[0].Severity != detector.SeverityOK ||
		got[1].Severity != detector.SeverityWarning || !strings.Contains(got[1].Message, "cannot read the state of eth1: hung") {
		t.Fatalf("verdicts %+v; want eth0 ok and eth1 a hung warning", got)
	}
	start = time.Now()
	got = w.check(context.Background())
	if time.Since(start) > time.Second || !strings.Contains(got[1].Message, "still hung") {
		t.Fatalf("second check: %+v after %s; want at once, still hung", got, time.Since(start))
	}
}

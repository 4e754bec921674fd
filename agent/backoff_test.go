package agent

import (
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
)

func TestRestartDelay(t *testing.T) {
	p := backoffPolicy{First: time.Second, Max: 30 * time.Second, Healthy: time.Minute}
	quick := attemptEnd{Ran: 2 * time.Second, Fault: true}
	healthy := attemptEnd{Ran: 2 * time.Minute, Fault: true}
	other := attemptEnd{Ran: 2 * time.Second} // another node's fault, or a scale event
	tests := []struct {
		name      string
		hist      []attemptEnd
		want      time.Duration
		wantQuick int
	}{
		{"first attempt", nil, 0, 0},
		{"one quick failure: at once", []attemptEnd{quick}, 0, 1},
		{"two", []attemptEnd{quick, quick}, time.Second, 2},
		{"three", []attemptEnd{quick, quick, quick}, 2 * time.Second, 3},
		{"four", []attemptEnd{quick, quick, quick, quick}, 4 * time.Second, 4},
		{"six", []attemptEnd{quick, quick, quick, quick, quick, quick}, 16 * time.Second, 6},
		{"capped", repeat(quick, 7), 30 * time.Second, 7},
		{"a healthy failure: at once", []attemptEnd{quick, quick, quick, healthy}, 0, 0},
		{"the streak starts after a healthy attempt", []attemptEnd{quick, quick, quick, healthy, quick, quick}, time.Second, 2},
		{"another node's end neither counts nor breaks", []attemptEnd{quick, other, quick, quick}, 2 * time.Second, 3},
		{"after another node's end: at once", []attemptEnd{quick, quick, other}, 0, 0},
		{"a long scale event ends the streak", []attemptEnd{quick, quick, {Ran: 2 * time.Minute}, quick}, 0, 1},
		{"just under healthy is quick", []attemptEnd{{Ran: 59 * time.Second, Fault: true}, {Ran: 59 * time.Second, Fault: true}}, time.Second, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, q := restartDelay(tc.hist, p)
			if got != tc.want || q != tc.wantQuick {
				t.Errorf("restartDelay = %v after %d quick failures, want %v after %d", got, q, tc.want, tc.wantQuick)
			}
		})
	}
	// Hundreds of failures neither overflow nor pass the cap.
	if got, _ := restartDelay(repeat(quick, 500), p); got != p.Max {
		t.Errorf("after 500 quick failures: %v, want the cap %v", got, p.Max)
	}
}

func repeat(e attemptEnd, n int) []attemptEnd {
	out := make([]attemptEnd, n)
	for i := range out {
		out[i] = e
	}
	return out
}

// TestRecentAttempts: the history kept is what the delay depends on.
func TestRecentAttempts(t *testing.T) {
	p := backoffPolicy{First: time.Second, Max: 30 * time.Second, Healthy: time.Minute}
	quick := attemptEnd{Ran: time.Second, Fault: true}
	healthy := attemptEnd{Ran: time.Hour}
	hist := []attemptEnd{quick, quick, healthy, quick}
	before, _ := restartDelay(hist, p)
	got := recentAttempts(hist, p)
	if len(got) != 1 || got[0] != quick {
		t.Fatalf("recentAttempts = %v, want the one quick failure after the healthy attempt", got)
	}
	if after, _ := restartDelay(got, p); after != before {
		t.Errorf("the delay changed from %v to %v", before, after)
	}
	if got := recentAttempts([]attemptEnd{quick, quick}, p); len(got) != 2 {
		t.Errorf("a streak was cut: %v", got)
	}
}

// TestBackoffCapUnderStore: a node waiting out its backoff must not make
// the next round time out without it.
func TestBackoffCapUnderStore(t *testing.T) {
	a := &Agent{cfg: Config{Rendezvous: Rendezvous{Backend: join.Hosted, JoinTimeout: 20 * time.Second}}}
	if got := a.backoff().Max; got != 10*time.Second {
		t.Errorf("cap with a 20s join timeout: %v, want 10s", got)
	}
	a.cfg.Rendezvous.Backend = join.Standalone
	if got := a.backoff().Max; got != backoffMax {
		t.Errorf("standalone cap: %v, want %v", got, backoffMax)
	}
}

package backoff

import (
	"testing"
	"time"
)

func TestRestartDelay(t *testing.T) {
	p := Policy{First: time.Second, Max: 30 * time.Second, Healthy: time.Minute}
	quick := Attempt{Ran: 2 * time.Second, Fault: true}
	healthy := Attempt{Ran: 2 * time.Minute, Fault: true}
	other := Attempt{Ran: 2 * time.Second} // another node's fault, or a scale event
	tests := []struct {
		name      string
		hist      []Attempt
		want      time.Duration
		wantQuick int
	}{
		{"first attempt", nil, 0, 0},
		{"one quick failure: at once", []Attempt{quick}, 0, 1},
		{"two", []Attempt{quick, quick}, time.Second, 2},
		{"three", []Attempt{quick, quick, quick}, 2 * time.Second, 3},
		{"four", []Attempt{quick, quick, quick, quick}, 4 * time.Second, 4},
		{"six", []Attempt{quick, quick, quick, quick, quick, quick}, 16 * time.Second, 6},
		{"capped", repeat(quick, 7), 30 * time.Second, 7},
		{"a healthy failure: at once", []Attempt{quick, quick, quick, healthy}, 0, 0},
		{"the streak starts after a healthy attempt", []Attempt{quick, quick, quick, healthy, quick, quick}, time.Second, 2},
		{"another node's end neither counts nor breaks", []Attempt{quick, other, quick, quick}, 2 * time.Second, 3},
		{"after another node's end: at once", []Attempt{quick, quick, other}, 0, 0},
		{"a long scale event ends the streak", []Attempt{quick, quick, {Ran: 2 * time.Minute}, quick}, 0, 1},
		{"just under healthy is quick", []Attempt{{Ran: 59 * time.Second, Fault: true}, {Ran: 59 * time.Second, Fault: true}}, time.Second, 2},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, q := p.Delay(tc.hist)
			if got != tc.want || q != tc.wantQuick {
				t.Errorf("Delay = %v after %d quick failures, want %v after %d", got, q, tc.want, tc.wantQuick)
			}
		})
	}
	// Hundreds of failures neither overflow nor pass the cap.
	if got, _ := p.Delay(repeat(quick, 500)); got != p.Max {
		t.Errorf("after 500 quick failures: %v, want the cap %v", got, p.Max)
	}
}

func repeat(e Attempt, n int) []Attempt {
	out := make([]Attempt, n)
	for i := range out {
		out[i] = e
	}
	return out
}

// TestRecentAttempts: the history kept is what the delay depends on.
func TestRecentAttempts(t *testing.T) {
	p := Policy{First: time.Second, Max: 30 * time.Second, Healthy: time.Minute}
	quick := Attempt{Ran: time.Second, Fault: true}
	healthy := Attempt{Ran: time.Hour}
	hist := []Attempt{quick, quick, healthy, quick}
	before, _ := p.Delay(hist)
	got := p.Recent(hist)
	if len(got) != 1 || got[0] != quick {
		t.Fatalf("Recent = %v, want the one quick failure after the healthy attempt", got)
	}
	if after, _ := p.Delay(got); after != before {
		t.Errorf("the delay changed from %v to %v", before, after)
	}
	if got := p.Recent([]Attempt{quick, quick}); len(got) != 2 {
		t.Errorf("a streak was cut: %v", got)
	}
}

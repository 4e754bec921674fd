package agent

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLoopHealth(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	tests := []struct {
		name      string
		phase     phase
		idle      time.Duration // since the last tick
		stop      bool
		live      string // "" for ok
		readiness string
	}{
		{name: "rendezvous", phase: phaseRendezvous, live: "", readiness: "rendezvous"},
		{name: "long rendezvous", phase: phaseRendezvous, idle: time.Hour, live: "", readiness: "rendezvous"},
		{name: "running", phase: phaseRunning, idle: healthTick, live: "", readiness: ""},
		{name: "stuck", phase: phaseRunning, idle: healthStale + time.Second,
			live: "supervision loop stuck: no tick for 31s while the workers run", readiness: ""},
		{name: "restarting", phase: phaseRestarting, idle: time.Minute, live: "", readiness: "restarting"},
		{name: "stopped", phase: phaseStopped, live: "", readiness: "stopped"},
		{name: "stopping", phase: phaseRunning, stop: true, live: "agent stopping: received terminated", readiness: "stopped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newLoopHealth(clock)
			h.set(tc.phase)
			now = now.Add(tc.idle)
			if tc.stop {
				ctx, cancel := context.WithCancelCause(t.Context())
				cancel(errors.New("received terminated"))
				h.stop(ctx)
			}
			if got := errString(h.Live()); got != tc.live {
				t.Errorf("Live: got %q, want %q", got, tc.live)
			}
			if got := errString(h.Ready()); got != tc.readiness {
				t.Errorf("Ready: got %q, want %q", got, tc.readiness)
			}
			h.ticked()
			if tc.phase == phaseRunning && !tc.stop && h.Live() != nil {
				t.Errorf("Live after a tick: %v", h.Live())
			}
		})
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

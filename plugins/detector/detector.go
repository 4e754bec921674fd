// Package detector is the plugin kind that checks a node's health: a site
// script, a fabric port, a scratch disk. Its findings go into the agent's
// one fault path, beside NVML's GPU health: restart-workers restarts the
// job through the rendezvous (counted against --max-restarts) and
// drain-node makes the node leave the job with exit code 3.
package detector

import (
	"context"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// Severity is how bad a finding is.
type Severity int

// The severities, least first.
const (
	SeverityOK      Severity = iota // healthy: the check passed
	SeverityWarning                 // worth a line in the log and a notification
	SeverityError                   // the node cannot train as it is
)

func (s Severity) String() string {
	switch s {
	case SeverityOK:
		return "ok"
	case SeverityWarning:
		return "warning"
	case SeverityError:
		return "error"
	}
	return fmt.Sprintf("severity(%d)", int(s))
}

// Action is what a finding asks the agent to do, least first.
type Action int

// The actions.
const (
	ActionNone           Action = iota // nothing: a healthy verdict, or news
	ActionWarn                         // log it and tell the notifiers
	ActionRestartWorkers               // restart the job's workers (a fault, counted against --max-restarts)
	ActionDrainNode                    // this node leaves the job; the agent exits 3
)

func (a Action) String() string {
	switch a {
	case ActionNone:
		return "none"
	case ActionWarn:
		return "warn"
	case ActionRestartWorkers:
		return "restart-workers"
	case ActionDrainNode:
		return "drain-node"
	}
	return fmt.Sprintf("action(%d)", int(a))
}

// Finding is one verdict of a check.
type Finding struct {
	// Subject is what the finding is about: "node", a GPU UUID, a NIC
	// ("eth0", "mlx5_0/1"), a path.
	Subject  string
	Severity Severity
	Action   Action
	Message  string    // one line, for the log, the report and the notifiers
	Time     time.Time // when it was found; zero: when the agent received it
}

// Schedule is what a detector promises once configured.
type Schedule struct {
	// Every is the longest the detector stays silent: it sends a verdict
	// (a healthy one too) at least this often. The agent treats a
	// detector silent for twice as long, plus a grace, as hung, and
	// restarts it.
	Every time.Duration
}

// Detector is a health check of the node. The agent calls Info, then
// Configure with the --plugin settings, then Watch for the job's life.
type Detector interface {
	Info(ctx context.Context) (plugins.Info, error)
	// Configure checks and takes the settings; an error is the user's
	// (a bad value) and stops the agent before the job starts.
	Configure(ctx context.Context, cfg plugins.Config) (Schedule, error)
	// Watch checks the node until ctx ends, passing each verdict to emit,
	// the healthy ones too (they are the detector's heartbeat). An error
	// from emit means the agent is gone: Watch returns it.
	Watch(ctx context.Context, emit func(Finding) error) error
}

// Package notifier is the plugin kind that hears a job's events: a chat
// channel, a pager, a site's own log. The agent delivers events off its
// loop through a bounded queue per notifier; a slow or dead notifier
// loses events (counted and reported), never training time.
package notifier

import (
	"context"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// EventKind names what happened. The names are part of the protocol:
// a webhook's consumers match on them.
type EventKind string

// The events.
const (
	JobStarted    EventKind = "job_started"    // the agent started this node's part of the job
	WorkerFailed  EventKind = "worker_failed"  // a worker of this node failed; Details["report"] is the root-cause report
	Restarted     EventKind = "restarted"      // the job's workers restart; Message says why (Details: restarts, max_restarts; none when another node's fault ended the round)
	Straggler     EventKind = "straggler"      // a persistent straggler was named (Rank; Details: cause, late, share), or acted on (Details: action)
	Hang          EventKind = "hang"           // a collective hung (Details: missing ranks, step, bucket, report with the stacks)
	GPUFault      EventKind = "gpu_fault"      // an NVML health finding that stops workers (Details: action, for a GPU reset or a drain)
	NodeLost      EventKind = "node_lost"      // the job moved to a new generation without a node
	NodeJoined    EventKind = "node_joined"    // the job moved to a new generation with a new node
	Reformed      EventKind = "reformed"       // the job's ranks re-formed in process after a fault, without a restart (Details: reform, step, resume, source, lost_steps, took_ms, error, <phase>_ms)
	HealthFinding EventKind = "health_finding" // a detector plugin's verdict on a subject changed: a warning, an error, or cleared (severity ok) (Details: plugin, subject, severity, action)
	PluginFailed  EventKind = "plugin_failed"  // a plugin crashed, hung, failed to start, or was refused on a restart (Details: plugin, restart_in)
	JobFinished   EventKind = "job_finished"   // every worker of this node succeeded
	JobFailed     EventKind = "job_failed"     // this node's part of the job ended in failure
)

// Event is one thing that happened to the job, as this node's agent saw it.
type Event struct {
	Kind       EventKind
	Time       time.Time
	Job        string // the run id
	Node       string // this node's name (its hostname)
	Generation uint64
	Attempt    int
	Rank       int    // the rank concerned, -1 for none
	Message    string // one line (a worker_failed's root-cause report is in Details["report"])
	// Details are the event's own fields (cause, exit code, the ranks a
	// hang misses...), each a string.
	Details map[string]string
}

// Notifier receives the job's events. The agent calls Info, then
// Configure with the --plugin settings, then Notify for each event, one
// at a time, each with a deadline.
type Notifier interface {
	Info(ctx context.Context) (plugins.Info, error)
	// Configure checks and takes the settings; an error is the user's and
	// stops the agent before the job starts.
	Configure(ctx context.Context, cfg plugins.Config) error
	// Notify delivers one event; an error is logged and counted, and the
	// event is not retried by the agent (a notifier retries inside Notify
	// if it wants to, within ctx).
	Notify(ctx context.Context, ev Event) error
}

package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// pluginFlush is how long the agent waits at exit for the notifiers to
// deliver what they hold (the job's last events among them).
const pluginFlush = 5 * time.Second

// Plugins says which plugins run beside the job.
type Plugins struct {
	Specs []pluginhost.Spec
	Dir   string // where the bundled plugins' binary is; "": next to the executable
}

// PluginFaultError is a detector plugin's finding that stops this node's
// workers: restart-workers restarts the job (a fault, counted against
// --max-restarts); drain-node makes the node leave the job, and the agent
// exit 3.
type PluginFaultError struct{ Finding pluginhost.Finding }

func (e *PluginFaultError) Error() string {
	f := e.Finding
	what := fmt.Sprintf("plugin %s: %s: %s", f.Plugin, f.Subject, f.Message)
	if e.Drains() {
		return what + ": this node must be drained; it leaves the job"
	}
	return what + ": restarting the workers"
}

// Drains reports whether the finding makes the node leave the job.
func (e *PluginFaultError) Drains() bool { return e.Finding.Action >= detector.ActionDrainNode }

// startPlugins starts the plugins; a finding that drains the node cancels
// the run with its *PluginFaultError, one that restarts the workers is a
// fault of the attempt. Without --plugin it starts nothing (a nil host
// notifies nothing).
func (a *Agent) startPlugins(runID string, cancel context.CancelCauseFunc, s *session) error {
	p := a.cfg.Plugins
	if len(p.Specs) == 0 {
		return nil
	}
	cfg := pluginhost.Config{Specs: p.Specs, Job: runID, Dir: pluginhost.BundledDir(p.Dir)}
	cfg.OnFinding = func(f pluginhost.Finding) {
		pf := &PluginFaultError{Finding: f}
		if pf.Drains() {
			cancel(pf)
			return
		}
		s.faults.report(&Fault{Source: FromPlugin, Seen: f.Time, Reason: pf.Error(), Err: pf})
	}
	h, err := pluginhost.Start(cfg, a.log)
	if err != nil {
		return err
	}
	s.plugins = h
	return nil
}

// notify tells the notifier plugins about an event of attempt at (nil:
// none yet).
func (s *session) notify(kind notifier.EventKind, at *attempt, rank int, msg string, details map[string]string) {
	if s.plugins == nil {
		return
	}
	ev := notifier.Event{Kind: kind, Rank: rank, Message: msg, Details: details}
	if at != nil {
		ev.Generation, ev.Attempt = at.gen, at.n
	}
	s.plugins.Notify(ev)
}

// roundEventKind is what a round's end says of the job's nodes: one lost
// or gone, one joined, or neither (another node's fault: a restart).
func roundEventKind(end rdzv.RoundEnd) notifier.EventKind {
	switch end.Kind {
	case rdzv.EndNodeLost, rdzv.EndNodeLeft:
		return notifier.NodeLost
	case rdzv.EndNodeJoined:
		return notifier.NodeJoined
	}
	return notifier.Restarted
}

// notifyStragglers tells the notifiers about each rank newly named a
// persistent straggler (the watch hands over the named ranks at every
// look).
func (s *session) notifyStragglers(named []telemetry.Straggler) {
	if s.plugins == nil {
		return
	}
	for _, st := range s.named.Fresh(named) {
		msg, details := pluginhost.StragglerNotice(st)
		s.notify(notifier.Straggler, nil, st.Rank, msg, details)
	}
}

// notifyEnd tells the notifiers how this node's part of the job ended.
func (s *session) notifyEnd(ctx context.Context, err error) {
	if err == nil {
		s.notify(notifier.JobFinished, nil, -1, "every worker of this node succeeded", nil)
		return
	}
	reason := "failed"
	if drainCause(ctx) != nil {
		reason = "drained"
	} else if _, ok := err.(*SignalError); ok {
		reason = "stopped"
	}
	s.notify(notifier.JobFailed, nil, -1, err.Error(), map[string]string{"reason": reason})
}

// notifyFault tells the notifiers about a fault other than a worker's
// failure that stops the attempt. A plugin's finding is not repeated: the
// host told them when the verdict came.
func (s *session) notifyFault(at *attempt, f *Fault) {
	switch f.Source {
	case FromHang:
		h, _ := errorsAs[*watch.HangError](f)
		s.notify(notifier.Hang, at, -1, f.Reason, pluginhost.HangDetails(h.Hang, h.Report))
	case FromGPU:
		s.notify(notifier.GPUFault, at, -1, f.Reason, nil)
	case FromStraggler:
		se, _ := errorsAs[*straggler.Error](f)
		s.notify(notifier.Straggler, at, se.Straggler.Rank, f.Reason, map[string]string{"action": string(se.Action)})
	}
}

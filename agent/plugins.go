package agent

import (
	"fmt"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
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

// startPlugins starts the plugins; a detector's finding that restarts the
// workers or drains the node is a fault, with that severity. Without
// --plugin it starts nothing (a nil host notifies nothing).
func (a *Agent) startPlugins(runID string, s *session) error {
	p := a.cfg.Plugins
	if len(p.Specs) == 0 {
		return nil
	}
	cfg := pluginhost.Config{Specs: p.Specs, Job: runID, Dir: pluginhost.BundledDir(p.Dir)}
	cfg.OnFinding = func(f pluginhost.Finding) {
		s.faults.report(pluginFault(&PluginFaultError{Finding: f}))
	}
	h, err := pluginhost.Start(cfg, a.log)
	if err != nil {
		return err
	}
	s.plugins = h
	return nil
}

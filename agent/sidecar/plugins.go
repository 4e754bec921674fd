package sidecar

import (
	"fmt"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// startPlugins starts the --plugin processes, as ddp-agent run does: a
// detector's restart-workers or drain-node verdict aborts every job's
// communicators here (the sidecar owns no workers to stop, and no node to
// drain: a drain is logged for the site to act on); the notifiers hear
// each job's hangs, persistent stragglers and GPU faults.
func (sc *Sidecar) startPlugins() error {
	if len(sc.cfg.Plugins) == 0 {
		return nil
	}
	cfg := pluginhost.Config{Specs: sc.cfg.Plugins, Job: "sidecar", Dir: pluginhost.BundledDir(sc.cfg.PluginDir)}
	cfg.OnFinding = func(f pluginhost.Finding) {
		what := fmt.Sprintf("plugin %s: %s: %s", f.Plugin, f.Subject, f.Message)
		if f.Action >= detector.ActionDrainNode {
			sc.log.Error("a plugin says this node must be drained; aborting every job's communicators here", "finding", what)
			sc.abortAll(what + ": this node must be drained")
			return
		}
		sc.abortAll(what + ": restarting the workers")
	}
	h, err := pluginhost.Start(cfg, sc.log)
	if err != nil {
		return err
	}
	sc.plugins = h
	return nil
}

// notify tells the notifiers an event (Job "" is the sidecar's own).
func (sc *Sidecar) notify(ev notifier.Event) {
	if sc.plugins != nil {
		sc.plugins.Notify(ev)
	}
}

func (sc *Sidecar) notifyHang(id string, h telemetry.Hang, reason, report string) {
	sc.notify(notifier.Event{Kind: notifier.Hang, Job: id, Generation: h.Gen, Rank: -1, Message: reason,
		Details: pluginhost.HangDetails(h, report)})
}

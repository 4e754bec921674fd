package agent

import (
	"errors"
	"strconv"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// eventKind is what the run tells the notifiers.
type eventKind int

const (
	evStarted    eventKind = iota // the job started on this node
	evFault                       // a fault stopped the attempt, or drains the node
	evRestarting                  // recover restarts the job's workers
	evEnded                       // this node's part of the job ended
	evReplaced                    // a warm spare took a dead worker's rank; the others re-form in process
)

// event is one thing the run tells the notifier plugins, as a typed
// value; notice maps it onto the plugin protocol, the one place that
// does.
type event struct {
	kind eventKind
	at   *attempt // the attempt it concerns; nil: none
	// fault is the fault told (evFault) or restarted for (evRestarting).
	fault *fault.Fault
	// blame and report are a worker's failure's root cause, as the
	// report gave it, and the report's block.
	blame  *rootcause.Blame
	report string
	// restarts and maxRestarts: evRestarting's count, with this one.
	restarts, maxRestarts int
	// err is how the job ended here (evEnded); nil: every worker
	// succeeded.
	err error
	// started is evStarted's message and details.
	started startedJob
	// dead and sparePID are evReplaced's: the worker that died, and the
	// spare that took its rank.
	dead     *supervisor.WorkerExitError
	sparePID int
}

// startedJob is what evStarted tells of the job.
type startedJob struct {
	runID, command, nnodes string
	nproc                  int
}

// notice is ev in the plugin protocol; false when there is nothing to
// tell: a detector's verdict was told by the host when it came, and a
// straggler drained for was told when the watch named it.
func (ev event) notice() (notifier.Event, bool) {
	n := notifier.Event{Rank: -1}
	if ev.at != nil {
		n.Generation, n.Attempt = ev.at.gen, ev.at.n
	}
	f := ev.fault
	switch ev.kind {
	case evStarted:
		s := ev.started
		n.Kind, n.Message = notifier.JobStarted, "job "+s.runID+" started on this node: "+s.command
		n.Details = map[string]string{"nproc_per_node": strconv.Itoa(s.nproc), "nnodes": s.nnodes}
	case evRestarting:
		n.Kind, n.Message = notifier.Restarted, "restarting the job's workers: "+f.Reason
		n.Details = map[string]string{"restarts": strconv.Itoa(ev.restarts), "max_restarts": strconv.Itoa(ev.maxRestarts)}
	case evEnded:
		if ev.err == nil {
			n.Kind, n.Message = notifier.JobFinished, "every worker of this node succeeded"
			break
		}
		reason := "failed"
		var fe *fault.Error
		var sig *SignalError
		switch {
		case errors.As(ev.err, &fe) && fe.Severity == fault.Drain:
			reason = "drained"
		case errors.As(ev.err, &sig):
			reason = "stopped"
		}
		n.Kind, n.Message, n.Details = notifier.JobFailed, ev.err.Error(), map[string]string{"reason": reason}
	case evFault:
		return faultNotice(n, f, ev)
	case evReplaced:
		// A worker's failure all the same, whose recovery kept the others.
		n.Kind, n.Rank = notifier.WorkerFailed, ev.dead.Rank
		n.Message = ev.dead.Error() + "; a warm spare takes its rank, the other workers keep their processes"
		n.Details = map[string]string{"recovery": "warm_spare", "spare_pid": strconv.Itoa(ev.sparePID)}
	}
	return n, true
}

// faultNotice is an evFault in the plugin protocol.
func faultNotice(n notifier.Event, f *fault.Fault, ev event) (notifier.Event, bool) {
	n.Message = f.Reason
	switch f.Source {
	case fault.FromRound:
		n.Kind = roundEventKind(ev.at.r.End())
	case fault.FromWorker:
		wf, _ := fault.As[*fault.WorkerFailedError](f)
		n.Kind, n.Rank, n.Message = notifier.WorkerFailed, ev.blame.Root, wf.Error()
		n.Details = map[string]string{"report": ev.report, "victims": fault.JoinInts(ev.blame.VictimRanks())}
	case fault.FromHang:
		h, _ := fault.As[*watch.HangError](f)
		n.Kind, n.Details = notifier.Hang, pluginhost.HangDetails(h.Hang, h.Report)
	case fault.FromGPU:
		n.Kind = notifier.GPUFault
		if gf, _ := fault.As[*fault.GPUError](f); f.Severity >= fault.Drain {
			n.Details = map[string]string{"action": gf.Action.String()}
		}
	case fault.FromStraggler:
		se, _ := fault.As[*straggler.Error](f)
		if f.Severity >= fault.Drain {
			return n, false
		}
		n.Kind, n.Rank, n.Details = notifier.Straggler, se.Straggler.Rank, map[string]string{"action": string(se.Action)}
	default: // fault.FromPlugin, fault.FromStore: the restart that follows is told
		return n, false
	}
	return n, true
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

// tell tells the notifier plugins ev; without plugins, nothing.
func (r *run) tell(ev event) {
	if r.plugins == nil {
		return
	}
	if n, ok := ev.notice(); ok {
		r.plugins.Notify(n)
	}
}

package fault

import (
	"fmt"
	"strings"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rootcause"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// The sources' own errors, each a Fault's Err.

// PluginError is a detector plugin's finding that stops this node's
// workers: restart-workers restarts the job (a fault, counted against
// --max-restarts); drain-node makes the node leave the job, and the agent
// exit 3.
type PluginError struct{ Finding pluginhost.Finding }

func (e *PluginError) Error() string {
	f := e.Finding
	what := fmt.Sprintf("plugin %s: %s: %s", f.Plugin, f.Subject, f.Message)
	if e.Drains() {
		return what + ": this node must be drained; it leaves the job"
	}
	return what + ": restarting the workers"
}

// Drains reports whether the finding makes the node leave the job.
func (e *PluginError) Drains() bool { return e.Finding.Action >= detector.ActionDrainNode }

// RoundEndedError is the cause of a round's end when the job moved to
// another generation because of something outside this node.
type RoundEndedError struct{ Reason string }

func (e *RoundEndedError) Error() string { return "generation ended: " + e.Reason }

// WorkerFailedError is the fault of an attempt in which this node's
// workers failed, with its root cause: the rank whose failure came first
// (maybe not the first to exit), and the ranks that failed only because of
// it.
type WorkerFailedError struct {
	Blame rootcause.Blame
	// Decided is when the root cause was worked out: what workers noted
	// or how they exited after it comes from the agent stopping them.
	Decided time.Time
}

func (e *WorkerFailedError) Error() string { return e.Blame.Reason() }

// Unwrap is the root cause's exit, when it is a worker of this node that
// has exited.
func (e *WorkerFailedError) Unwrap() error {
	if e.Blame.Exit == nil {
		return nil
	}
	return e.Blame.Exit
}

// GPUError is a GPU health finding that stops this node's workers:
// ActionRestartWorkers restarts the job (a fault, counted against
// --max-restarts); ActionResetGPU and ActionDrainNode make the node leave
// the job and the agent exit non-zero, so the scheduler replaces it.
type GPUError struct {
	Action   health.Action
	Findings []health.Finding // those that call for Action or less, most severe first
}

func (e *GPUError) Error() string {
	switch e.Action {
	case health.ActionResetGPU:
		return fmt.Sprintf("%s: the GPU needs a reset (nvidia-smi -r -i %d) or the node a reboot; this node leaves the job", e.Finding(), e.Findings[0].GPU)
	case health.ActionDrainNode:
		return e.Finding() + ": this node must be drained; it leaves the job"
	}
	return e.Finding() + ": restarting the workers"
}

// Finding is the fault without what the agent does about it: "GPU 1
// (GPU-...): Xid 31 ...: ranks 1".
func (e *GPUError) Finding() string {
	f := e.Findings[0]
	var b strings.Builder
	fmt.Fprintf(&b, "GPU %d (%s): %s", f.GPU, f.UUID, f.Message)
	if f.Count > 1 {
		fmt.Fprintf(&b, " (%d times)", f.Count)
	}
	if len(f.Ranks) > 0 {
		fmt.Fprintf(&b, ", ranks %s", JoinInts(f.Ranks))
	}
	if n := len(e.Findings) - 1; n > 0 {
		fmt.Fprintf(&b, ", and %d more finding(s)", n)
	}
	return b.String()
}

// Before reports whether every finding of the fault was last seen before t.
func (e *GPUError) Before(t time.Time) bool { return e.Last().Before(t) }

// Last is when the fault's newest finding was last seen.
func (e *GPUError) Last() time.Time {
	var last time.Time
	for _, f := range e.Findings {
		if f.Last.After(last) {
			last = f.Last
		}
	}
	return last
}

// Drains reports whether the fault makes the node leave the job.
func (e *GPUError) Drains() bool { return e.Action >= health.ActionResetGPU }

// JoinInts is v as "1,2,3", as the log and the notices write ranks.
func JoinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ",")
}

package agent

import (
	"strings"
	"syscall"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// TestReplacedNotice: a worker a warm spare replaced reaches the
// notifiers as the worker's failure it was, with its recovery.
func TestReplacedNotice(t *testing.T) {
	dead := &supervisor.WorkerExitError{Rank: 3, LocalRank: 1, PID: 4411, Code: -1, Signal: syscall.SIGKILL}
	n, ok := event{kind: evReplaced, dead: dead, sparePID: 4500}.notice()
	switch {
	case !ok || n.Kind != notifier.WorkerFailed || n.Rank != 3:
		t.Fatalf("got %v %+v, want rank 3's worker_failed", ok, n)
	case !strings.Contains(n.Message, "killed by signal 9") || !strings.Contains(n.Message, "a warm spare takes its rank"):
		t.Errorf("message %q", n.Message)
	case n.Details["recovery"] != "warm_spare" || n.Details["spare_pid"] != "4500":
		t.Errorf("details %v", n.Details)
	}
}

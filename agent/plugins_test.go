package agent

import (
	"testing"

	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

func TestRoundEventKind(t *testing.T) {
	for reason, want := range map[string]notifier.EventKind{
		"node b (h2, group rank 1) lost: its agent is gone or cut off (lease ended)": notifier.NodeLost,
		"node b (h2, group rank 1) left: drained":                                    notifier.NodeLost,
		"node c (h3) joined; scaling up from 2 nodes":                                notifier.NodeJoined,
		"node a (h1, group rank 0): worker 3 exited with code 1":                     notifier.Restarted,
	} {
		if got := roundEventKind(reason); got != want {
			t.Errorf("roundEventKind(%q) = %s, want %s", reason, got, want)
		}
	}
}

package agent

import (
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

func TestRoundEventKind(t *testing.T) {
	tests := []struct {
		name string
		end  rdzv.RoundEnd
		want notifier.EventKind
	}{
		{"lost", rdzv.RoundEnd{Kind: rdzv.EndNodeLost, Node: "b"}, notifier.NodeLost},
		{"left", rdzv.RoundEnd{Kind: rdzv.EndNodeLeft, Node: "b"}, notifier.NodeLost},
		{"joined", rdzv.RoundEnd{Kind: rdzv.EndNodeJoined, Node: "c"}, notifier.NodeJoined},
		{"another node's fault", rdzv.RoundEnd{Kind: rdzv.EndRestart, Node: "a"}, notifier.Restarted},
		{"lost its lease and rejoined", rdzv.RoundEnd{Kind: rdzv.EndRestart, Node: "b"}, notifier.Restarted},
		{"an old agent's state", rdzv.RoundEnd{}, notifier.Restarted},
		{"this node's lease", rdzv.RoundEnd{Kind: rdzv.EndLeaseLost, Node: "a"}, notifier.Restarted},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := roundEventKind(tc.end); got != tc.want {
				t.Errorf("roundEventKind(%v): got %v, want %v", tc.end, got, tc.want)
			}
		})
	}
}

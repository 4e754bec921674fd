package rdzv

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestMoves(t *testing.T) {
	m := Member{Node: "n1", Host: "host-b", GroupRank: 3}
	tests := []struct {
		name       string
		got        move
		wantEnd    RoundEnd
		wantFault  bool
		wantReason string
	}{
		{"a worker failed", faultMove("n0", "host-a", 0, "worker 3 exited with code 1"),
			RoundEnd{Kind: EndRestart, Node: "n0"}, true, "node n0 (host-a, group rank 0): worker 3 exited with code 1"},
		{"lost its lease and rejoined", rejoinMove("n0"),
			RoundEnd{Kind: EndRestart, Node: "n0"}, true, "node n0 lost its lease and rejoined"},
		{"joined a job with room", joinMove("n2", "host-c", 2),
			RoundEnd{Kind: EndNodeJoined, Node: "n2"}, false, "node n2 (host-c) joined; scaling up from 2 nodes"},
		{"left", leftMove(m, "drained"),
			RoundEnd{Kind: EndNodeLeft, Node: "n1"}, false, "node n1 (host-b, group rank 3) left: drained"},
		{"lost", lostMove(m),
			RoundEnd{Kind: EndNodeLost, Node: "n1"}, true, "node n1 (host-b, group rank 3) lost: its agent is gone or cut off (lease ended)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got.End != tc.wantEnd {
				t.Errorf("end: got %v, want %v", tc.got.End, tc.wantEnd)
			}
			if tc.got.Fault != tc.wantFault {
				t.Errorf("fault: got %v, want %v", tc.got.Fault, tc.wantFault)
			}
			if tc.got.Reason != tc.wantReason {
				t.Errorf("reason: got %q, want %q", tc.got.Reason, tc.wantReason)
			}
		})
	}
}

// TestStateEnd: the typed end is stored beside the reason, and a state
// written before it existed still reads, as EndUnknown.
func TestStateEnd(t *testing.T) {
	tests := []struct {
		name string
		raw  string
		want RoundEnd
	}{
		{"typed", `{"generation":4,"phase":"joining","reason":"node n1 (h, group rank 1) lost: x","end":{"kind":"node-lost","node":"n1"}}`,
			RoundEnd{Kind: EndNodeLost, Node: "n1"}},
		{"old record without end", `{"generation":4,"phase":"joining","reason":"node n1 (h, group rank 1) lost: x"}`,
			RoundEnd{}},
		{"kind only", `{"generation":4,"phase":"joining","end":{"kind":"restart"}}`,
			RoundEnd{Kind: EndRestart}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var st State
			if err := decode("state", []byte(tc.raw), &st); err != nil {
				t.Fatalf("decode: got %v, want nil", err)
			}
			if st.End != tc.want {
				t.Errorf("end: got %v, want %v", st.End, tc.want)
			}
			var again State
			if err := json.Unmarshal([]byte(encode(st)), &again); err != nil || again.End != tc.want {
				t.Errorf("round trip: got %v (%v), want %v", again.End, err, tc.want)
			}
		})
	}
	if got := encode(State{Phase: Joining}); strings.Contains(got, `"end"`) {
		t.Errorf("zero end encoded: got %s, want no end", got)
	}
}

func TestRoundEnd(t *testing.T) {
	tests := []struct {
		name       string
		ends       []RoundEnd // finish calls in order
		wantEnd    RoundEnd
		wantReason string
	}{
		{"running", nil, RoundEnd{}, ""},
		{"ended", []RoundEnd{{Kind: EndNodeJoined, Node: "n2"}}, RoundEnd{Kind: EndNodeJoined, Node: "n2"}, "node-joined (node n2)"},
		{"first end counts", []RoundEnd{{Kind: EndNodeLost, Node: "n1"}, {Kind: EndStopped}}, RoundEnd{Kind: EndNodeLost, Node: "n1"}, "node-lost (node n1)"},
		{"unknown", []RoundEnd{{}}, RoundEnd{}, "unknown"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := newRound(&State{}, Member{})
			for _, e := range tc.ends {
				r.finish(e, e.String())
			}
			if got := r.End(); got != tc.wantEnd {
				t.Errorf("End: got %v, want %v", got, tc.wantEnd)
			}
			if got := r.Reason(); got != tc.wantReason {
				t.Errorf("Reason: got %q, want %q", got, tc.wantReason)
			}
		})
	}
}

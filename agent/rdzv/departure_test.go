package rdzv

import (
	"fmt"
	"testing"
)

func TestDepartureOf(t *testing.T) {
	m := Member{Node: "n1", Host: "host-b", GroupRank: 3}
	lost := departure{Moves: true, move: move{End: RoundEnd{Kind: EndNodeLost, Node: "n1"}, Fault: true,
		Reason: "node n1 (host-b, group rank 3) lost: its agent is gone or cut off (lease ended)"}}
	tests := []struct {
		name string
		last NodeInfo
		want departure
	}{
		{"succeeded: the job stays", NodeInfo{Node: "n1", State: NodeSucceeded}, departure{}},
		{"left: a scale event", NodeInfo{Node: "n1", State: NodeLeft, Reason: "SIGTERM"},
			departure{Moves: true, move: move{End: RoundEnd{Kind: EndNodeLeft, Node: "n1"},
				Reason: "node n1 (host-b, group rank 3) left: SIGTERM"}}},
		{"active when deleted: its lease ran out", NodeInfo{Node: "n1", State: NodeActive}, lost},
		{"last value unknown", NodeInfo{}, lost},
		{"unknown node state", NodeInfo{State: "paused"}, lost},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := departureOf(m, tc.last); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestAbsentMembers(t *testing.T) {
	members := map[string]Member{
		"a": {Node: "a", GroupRank: 0}, "b": {Node: "b", GroupRank: 1},
		"c": {Node: "c", GroupRank: 2}, "d": {Node: "d", GroupRank: 3},
	}
	tests := []struct {
		name string
		live map[string]bool
		self string
		want string
	}{
		{"all live", map[string]bool{"a": true, "b": true, "c": true, "d": true}, "a", "[]"},
		{"by group rank", map[string]bool{"b": true}, "b", "[a c d]"},
		{"never this node itself", map[string]bool{"a": true, "b": true}, "d", "[c]"},
		{"spares do not count", map[string]bool{"a": true, "b": true, "c": true, "spare": true}, "a", "[d]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var nodes []string
			for _, m := range absentMembers(members, tc.live, tc.self) {
				nodes = append(nodes, m.Node)
			}
			if got := fmt.Sprint(nodes); got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
}

func TestRoundOver(t *testing.T) {
	tests := []struct {
		name string
		st   State
		want bool
	}{
		{"still running", State{Generation: 4, Phase: Running}, false},
		{"succeeded: the others finish", State{Generation: 4, Phase: Succeeded}, false},
		{"a new generation", State{Generation: 5, Phase: Joining}, true},
		{"the same generation failed", State{Generation: 4, Phase: Failed}, true},
		{"the same generation joining again (reset)", State{Generation: 4, Phase: Joining}, true},
		{"a later generation running", State{Generation: 6, Phase: Running}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := roundOver(tc.st, 4); got != tc.want {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}

package rdzv

import (
	"strings"
	"testing"
)

func TestAssignKeepsRanks(t *testing.T) {
	j := func(node string, rev int64) joiner { return joiner{JoinInfo: JoinInfo{Node: node, NProc: 1}, rev: rev} }
	prev := []Member{{Node: "a", GroupRank: 0}, {Node: "b", GroupRank: 1}, {Node: "c", GroupRank: 2}}
	tests := []struct {
		name    string
		prev    []Member
		joiners []joiner
		max     int
		want    string
	}{
		{"first round in join order", nil, []joiner{j("x", 5), j("y", 3), j("z", 9)}, 3, "y x z"},
		{"all survive", prev, []joiner{j("c", 1), j("b", 2), j("a", 3)}, 3, "a b c"},
		{"rank 0 lost: the highest survivor takes it", prev, []joiner{j("b", 1), j("c", 2)}, 3, "c b"},
		{"middle lost", prev, []joiner{j("a", 1), j("c", 2)}, 3, "a c"},
		{"newcomer fills the gap", prev, []joiner{j("n", 1), j("a", 2), j("c", 3)}, 3, "a n c"},
		{"too many: survivors first", prev, []joiner{j("n", 1), j("c", 2), j("b", 3), j("a", 4)}, 3, "a b c"},
		{"too many newcomers: earliest first", nil, []joiner{j("p", 4), j("q", 2), j("r", 3)}, 2, "q r"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ms := assign(tc.prev, tc.joiners, tc.max)
			var got []string
			for r, m := range ms {
				if m.GroupRank != r || m.RankOffset != r {
					t.Fatalf("member %d: %+v", r, m)
				}
				got = append(got, m.Node)
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("got %q, want %q", g, tc.want)
			}
		})
	}
}

package rdzv

import (
	"sort"
)

// joiner is a node that joined a round, in the order it joined.
type joiner struct {
	JoinInfo
	rev int64 // create revision of its join key: the join order
}

// assign picks the members of a closing round and their group ranks.
//
// Ranks are stable: a node of the last round keeps its group rank when
// that rank still exists in the new, possibly smaller, world. The ranks
// left free go to the other nodes, survivors first in the order of their
// old ranks, then newcomers in join order. With more joiners than max,
// survivors are preferred, then the earliest newcomers; the others stay
// spares. joiners must be in join order.
func assign(prev []Member, joiners []joiner, max int) []Member {
	oldRank := make(map[string]int, len(prev))
	for _, m := range prev {
		oldRank[m.Node] = m.GroupRank
	}
	// survivors first (by old rank), then newcomers (by join order)
	order := make([]joiner, len(joiners))
	copy(order, joiners)
	sort.SliceStable(order, func(i, j int) bool {
		ri, iOld := oldRank[order[i].Node]
		rj, jOld := oldRank[order[j].Node]
		switch {
		case iOld && jOld:
			return ri < rj
		case iOld != jOld:
			return iOld
		}
		return order[i].rev < order[j].rev
	})
	if len(order) > max {
		order = order[:max]
	}
	n := len(order)
	byRank := make([]*joiner, n)
	var rest []*joiner
	for i := range order {
		j := &order[i]
		if r, ok := oldRank[j.Node]; ok && r >= 0 && r < n && byRank[r] == nil {
			byRank[r] = j
			continue
		}
		rest = append(rest, j)
	}
	for r := range byRank {
		if byRank[r] == nil {
			byRank[r], rest = rest[0], rest[1:]
		}
	}
	members := make([]Member, n)
	offset := 0
	for r, j := range byRank {
		members[r] = Member{Node: j.Node, Host: j.Host, Addr: j.Addr, GroupRank: r, NProc: j.NProc, RankOffset: offset}
		offset += j.NProc
	}
	return members
}

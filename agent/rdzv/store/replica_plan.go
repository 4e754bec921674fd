package store

import (
	"slices"
	"time"
)

// replicaView is what one look at the store shows a replica manager: the
// cluster's members, and which of them an agent alive owns (its owner key,
// on that agent's lease, exists).
type replicaView struct {
	members []memberView
	// owned: member id -> the create revision of its owner key. A member
	// is owned while the agent that runs it holds its lease.
	owned map[uint64]int64
}

type memberView struct {
	id      uint64
	learner bool
}

// replicaPlan is what to do after one look.
type replicaPlan struct {
	remove  uint64 // a member whose agent is gone, to remove; 0 = none
	join    bool   // this agent should add a member of its own
	ownGone bool   // this agent's member is no longer in the cluster
	keeper  bool   // this agent's member is the oldest owned one (see Replicas.Keeper)
	voters  int
}

// planReplicas decides, from one look, what a replica manager does. own is
// this agent's member id (0: it has none); ownerless says since when each
// member has been seen without an owner, and is updated in place; a member
// ownerless for grace is taken as dead (its agent's lease expired, or the
// agent died between adding it and claiming it). want is the number of
// voting members to keep.
//
// One change per look: a removal first, since a dead member counts
// against the quorum and a new one would not fit the count; a join only
// when no learner is in the way (etcd admits one at a time, which also
// keeps two agents from joining into the same place).
func planReplicas(v replicaView, own uint64, ownerless map[uint64]time.Time, now time.Time, grace time.Duration, want int) replicaPlan {
	var p replicaPlan
	learners, ownIn := 0, false
	present := map[uint64]bool{}
	var dead []uint64
	for _, m := range v.members {
		present[m.id] = true
		if m.learner {
			learners++
		} else {
			p.voters++
		}
		if m.id == own {
			ownIn = true
			continue
		}
		if _, ok := v.owned[m.id]; ok {
			delete(ownerless, m.id)
			continue
		}
		since, seen := ownerless[m.id]
		if !seen {
			ownerless[m.id] = now
			continue
		}
		if now.Sub(since) >= grace {
			dead = append(dead, m.id)
		}
	}
	for id := range ownerless {
		if !present[id] {
			delete(ownerless, id)
		}
	}
	if len(dead) > 0 {
		slices.Sort(dead)
		p.remove = dead[0]
		return p
	}
	if own != 0 && !ownIn {
		p.ownGone = true
		return p
	}
	if own == 0 && learners == 0 && len(v.members) < want {
		p.join = true
	}
	if own != 0 {
		p.keeper = oldestOwned(v) == own
	}
	return p
}

// oldestOwned is the member whose owner key was written first, among
// those still in the cluster: the first agent's while it lives. 0 = none.
func oldestOwned(v replicaView) uint64 {
	var best uint64
	var bestRev int64
	for _, m := range v.members {
		rev, ok := v.owned[m.id]
		if ok && (best == 0 || rev < bestRev) {
			best, bestRev = m.id, rev
		}
	}
	return best
}

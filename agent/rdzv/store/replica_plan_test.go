package store

import (
	"testing"
	"time"
)

func TestPlanReplicas(t *testing.T) {
	t0 := time.Unix(1000, 0)
	voters := func(ids ...uint64) []memberView {
		var ms []memberView
		for _, id := range ids {
			ms = append(ms, memberView{id: id})
		}
		return ms
	}
	owned := func(ids ...uint64) map[uint64]int64 {
		m := map[uint64]int64{}
		for i, id := range ids {
			m[id] = int64(10 + i)
		}
		return m
	}
	tests := []struct {
		name      string
		v         replicaView
		own       uint64
		ownerless map[uint64]time.Time
		want      replicaPlan
	}{
		{"lone first member: keeper, nothing to do", replicaView{voters(1), owned(1)}, 1, nil,
			replicaPlan{keeper: true, voters: 1}},
		{"agent without a member joins a small cluster", replicaView{voters(1), owned(1)}, 0, nil,
			replicaPlan{join: true, voters: 1}},
		{"full cluster: nobody joins", replicaView{voters(1, 2, 3), owned(1, 2, 3)}, 0, nil,
			replicaPlan{voters: 3}},
		{"a learner is in the way", replicaView{append(voters(1, 2), memberView{id: 3, learner: true}), owned(1, 2, 3)}, 0, nil,
			replicaPlan{voters: 2}},
		{"ownerless, first seen: not yet dead, and no join over it", replicaView{voters(1, 2), owned(1)}, 0, nil,
			replicaPlan{join: true, voters: 2}},
		{"ownerless within grace", replicaView{voters(1, 2, 3), owned(1, 3)}, 3,
			map[uint64]time.Time{2: t0.Add(-time.Second)}, replicaPlan{voters: 3}},
		{"ownerless past grace: removed, lowest id first", replicaView{voters(1, 2, 3), owned(3)}, 3,
			map[uint64]time.Time{1: t0.Add(-3 * time.Second), 2: t0.Add(-3 * time.Second)}, replicaPlan{remove: 1, voters: 3}},
		{"own member removed by the others", replicaView{voters(1, 2), owned(1, 2)}, 3, nil,
			replicaPlan{ownGone: true, voters: 2}},
		{"not the oldest: not keeper", replicaView{voters(1, 2, 3), map[uint64]int64{1: 50, 2: 20, 3: 30}}, 1, nil,
			replicaPlan{voters: 3}},
		{"oldest gone: the next oldest keeps", replicaView{voters(1, 3), map[uint64]int64{1: 50, 3: 30}}, 3, nil,
			replicaPlan{keeper: true, voters: 2}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ownerless := tc.ownerless
			if ownerless == nil {
				ownerless = map[uint64]time.Time{}
			}
			got := planReplicas(tc.v, tc.own, ownerless, t0, 2*time.Second, 3)
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
			for id := range ownerless {
				if _, ok := tc.v.owned[id]; ok {
					t.Errorf("member %x is owned but still counted ownerless", id)
				}
			}
		})
	}
}

func TestPlanReplicasForgetsGoneMembers(t *testing.T) {
	ownerless := map[uint64]time.Time{7: time.Unix(0, 0)}
	planReplicas(replicaView{members: []memberView{{id: 1}}, owned: map[uint64]int64{1: 1}}, 1, ownerless, time.Unix(100, 0), time.Second, 3)
	if len(ownerless) != 0 {
		t.Errorf("ownerless = %v, want member 7 forgotten", ownerless)
	}
}

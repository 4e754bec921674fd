package pluginhost

import (
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

func TestNotices(t *testing.T) {
	var n NamedStragglers
	st := func(r int) telemetry.Straggler {
		return telemetry.Straggler{Rank: r, Late: 300 * time.Millisecond, Share: 0.25, Cause: "compute"}
	}
	for i, tc := range []struct{ named, fresh []int }{
		{[]int{1}, []int{1}},
		{[]int{1, 2}, []int{2}},
		{[]int{2}, nil},
		{[]int{1, 2}, []int{1}}, // 1 recovered, then named again: told again
	} {
		var named []telemetry.Straggler
		for _, r := range tc.named {
			named = append(named, st(r))
		}
		var got []int
		for _, s := range n.Fresh(named) {
			got = append(got, s.Rank)
		}
		if len(got) != len(tc.fresh) || (len(got) > 0 && got[0] != tc.fresh[0]) {
			t.Errorf("look %d: fresh %v, want %v", i, got, tc.fresh)
		}
	}
	msg, d := StragglerNotice(st(3))
	if msg != "persistent straggler: rank 3 held the others back by 300ms, 25.0% of the step time; cause compute" ||
		d["cause"] != "compute" || d["share"] != "0.250" {
		t.Errorf("notice: %q %v", msg, d)
	}
	if d := HangDetails(telemetry.Hang{Key: telemetry.Key{Step: 7, Bucket: 2}, Missing: []int{1, 3}}, "r"); d["missing"] != "1,3" || d["step"] != "7" ||
		d["bucket"] != "2" || d["report"] != "r" {
		t.Errorf("hang details: %v", d)
	}
}

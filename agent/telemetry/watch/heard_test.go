package watch

import (
	"slices"
	"testing"
	"time"
)

func TestHeardUnjudged(t *testing.T) {
	now := time.Now()
	var h heard
	h.reset()
	h.from("node-b", now.Add(-time.Second), 2, 3)
	h.from("node-c", now.Add(-silentAfter-time.Second), 4, 5)
	// Ranks 0 and 1 are this node's: always judged.
	if got, _ := h.unjudged([]int{0, 1, 2}, 0, 2, now); len(got) != 0 {
		t.Errorf("a node heard a second ago: got %v unjudged", got)
	}
	got, why := h.unjudged([]int{1, 3, 4, 6}, 0, 2, now)
	if !slices.Equal(got, []int{4, 6}) || why == "" {
		t.Errorf("got %v (%q), want 4 (a silent node) and 6 (a node never heard)", got, why)
	}
	h.from("node-c", now)
	if got, _ := h.unjudged([]int{4}, 0, 2, now); len(got) != 0 {
		t.Errorf("node-c sent again: got %v", got)
	}
	var empty heard
	if got, _ := empty.unjudged([]int{2}, 0, 2, now); !slices.Equal(got, []int{2}) {
		t.Errorf("nothing heard: got %v", got)
	}
}

func TestHeardOneNode(t *testing.T) {
	var h heard
	h.from("b", time.Now(), 2, 3)
	h.from("c", time.Now(), 4, 5)
	for _, tc := range []struct {
		missing []int
		want    string
	}{
		{[]int{3}, "b"},
		{[]int{2, 3}, "b"},
		{[]int{3, 4}, ""}, // two nodes
		{[]int{1, 3}, ""}, // one here
		{[]int{7}, ""},    // a node never heard from
		{nil, ""},
	} {
		if got := h.oneNode(tc.missing, 0, 2); got != tc.want {
			t.Errorf("oneNode(%v): got %q, want %q", tc.missing, got, tc.want)
		}
	}
}

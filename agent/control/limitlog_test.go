package control

import (
	"testing"
	"time"
)

func TestNextLimitLog(t *testing.T) {
	const every = 30 * time.Second
	t0 := time.Unix(1000, 0)
	var st limitLogState
	steps := []struct {
		at    time.Duration
		write bool
		left  int
	}{
		{0, true, 0},                    // the first refusal is logged
		{time.Second, false, 0},         // then not, for every
		{every - time.Second, false, 0}, // still within
		{every, true, 2},                // the next line says how many it left out
		{every + 1, false, 0},
		{3 * every, true, 1},
	}
	for i, s := range steps {
		var write bool
		var left int
		st, write, left = nextLimitLog(st, t0.Add(s.at), every)
		if write != s.write || left != s.left {
			t.Errorf("step %d at %v: got write %v left %d, want %v %d", i, s.at, write, left, s.write, s.left)
		}
	}
}

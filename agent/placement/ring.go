package placement

import (
	"math"
	"slices"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// exactMax is the largest number of GPUs whose ring is found by exhaustive
// search: (n-1)! orders, pruned to a few milliseconds for 10; beyond
// it greedy rings improved by local search are good and fast (a few
// milliseconds for 16).
const exactMax = 10

// score rates a link: more NVLinks are better, and any NVLink beats any
// PCIe path (8 per NVLink against at most 5 for PCIe); between links with
// the same NVLinks the nearer PCIe path wins.
func score(l nvml.Link) int {
	return 8*l.NVLinks + pcieRank(l.PCIe)
}

// pcieRank orders the PCIe paths from unknown (0) and the farthest up to
// the nearest.
func pcieRank(p nvml.PathClass) int {
	switch p {
	case nvml.PathPIX:
		return 5
	case nvml.PathPXB:
		return 4
	case nvml.PathPHB:
		return 3
	case nvml.PathNODE:
		return 2
	case nvml.PathSYS:
		return 1
	}
	return 0
}

// link is Links[a][b], or an unknown link when the topology lacks it.
func link(t *nvml.Topology, a, b int) nvml.Link {
	if a < len(t.Links) && b < len(t.Links[a]) {
		return t.Links[a][b]
	}
	return nvml.Link{}
}

// linkScores rates every pair of gpus (any order), indexed like gpus. A
// pair the two directions of which differ gets the worse of the two.
func linkScores(t *nvml.Topology, gpus []int) [][]int {
	w := make([][]int, len(gpus))
	for i, a := range gpus {
		w[i] = make([]int, len(gpus))
		for j, b := range gpus {
			if i != j {
				w[i][j] = min(score(link(t, a, b)), score(link(t, b, a)))
			}
		}
	}
	return w
}

// ringScore is how good a ring is. A ring collective moves data at the
// pace of its slowest hop, so the weakest link decides first (one PCIe
// hop in a ring of NVLinks costs more than a few NVLinks fewer
// elsewhere); then the fewer hops at that weakest level the better (two
// hops across the CPU interconnect share it); the total breaks the
// remaining ties, favouring rings whose other hops are faster.
type ringScore struct{ min, atMin, sum int }

func (s ringScore) better(o ringScore) bool {
	if s.min != o.min {
		return s.min > o.min
	}
	if s.atMin != o.atMin {
		return s.atMin < o.atMin
	}
	return s.sum > o.sum
}

// add extends s by a hop of score e.
func (s ringScore) add(e int) ringScore {
	switch {
	case e < s.min:
		s.min, s.atMin = e, 1
	case e == s.min:
		s.atMin++
	}
	s.sum += e
	return s
}

// noHops is the score of a path without hops, before the first add.
var noHops = ringScore{min: math.MaxInt}

func evalRing(w [][]int, ring []int) ringScore {
	s := noHops
	for i, a := range ring {
		s = s.add(w[a][ring[(i+1)%len(ring)]])
	}
	return s
}

// ringOrder orders the GPUs 0..len(w)-1 into the best ring under w. The
// answer starts at GPU 0 and, among equally good rings, is the
// lexicographically smallest, so that GPUs linked all alike (NVSwitch)
// keep their own order.
func ringOrder(w [][]int) []int {
	n := len(w)
	if n <= 3 { // every ring of three or fewer is the same ring
		ring := make([]int, n)
		for i := range ring {
			ring[i] = i
		}
		return ring
	}
	if n <= exactMax {
		return exactRing(w)
	}
	return heuristicRing(w)
}

// exactRing tries every ring starting at 0 in lexicographic order and
// keeps the first of the best, skipping a branch as soon as even perfect
// remaining hops could not beat the best ring found.
func exactRing(w [][]int) []int {
	n := len(w)
	top := 0
	for _, row := range w {
		top = max(top, slices.Max(row))
	}
	var best []int
	bestScore := ringScore{min: -1}
	path := make([]int, 1, n)
	used := make([]bool, n)
	used[0] = true
	var walk func(s ringScore)
	walk = func(s ringScore) {
		last := path[len(path)-1]
		if len(path) == n {
			if s := s.add(w[last][0]); s.better(bestScore) {
				best, bestScore = slices.Clone(path), s
			}
			return
		}
		left := n - len(path) // hops still to choose after the next one, the closing one included
		for v := 1; v < n; v++ {
			if used[v] {
				continue
			}
			// No ring through here beats the best if even perfect hops for
			// the rest would not: the weakest link cannot rise, nor the
			// count of hops at it fall.
			next := s.add(w[last][v])
			bound := next
			for range left {
				// When every link is alike (NVSwitch) top is the weakest
				// link too, and this counts the hops at it: without that
				// no branch is ever cut.
				bound = bound.add(top)
			}
			if !bound.better(bestScore) {
				continue
			}
			used[v] = true
			path = append(path, v)
			walk(next)
			path = path[:len(path)-1]
			used[v] = false
		}
	}
	walk(noHops)
	return best
}

// heuristicRing builds a greedy ring from every start (always taking the
// best link onwards, the lowest GPU on ties), improves each by local
// search, and keeps the best, in canonical form.
func heuristicRing(w [][]int) []int {
	n := len(w)
	var best []int
	var bestScore ringScore
	for start := range n {
		ring := greedyRing(w, start)
		improve(w, ring)
		ring = canonical(ring)
		s := evalRing(w, ring)
		if best == nil || s.better(bestScore) || s == bestScore && slices.Compare(ring, best) < 0 {
			best, bestScore = ring, s
		}
	}
	return best
}

func greedyRing(w [][]int, start int) []int {
	n := len(w)
	ring := []int{start}
	used := make([]bool, n)
	used[start] = true
	for len(ring) < n {
		last, next := ring[len(ring)-1], -1
		for v := range n {
			if !used[v] && (next < 0 || w[last][v] > w[last][next]) {
				next = v
			}
		}
		used[next] = true
		ring = append(ring, next)
	}
	return ring
}

// improve makes moves that better ring, in place, until none is left:
// 2-opt (reversing a stretch) and or-opt (moving a stretch of up to three
// GPUs elsewhere). Each pass is O(n³) evaluations of O(n); every move
// strictly betters the score, so the passes end.
func improve(w [][]int, ring []int) {
	n := len(ring)
	cur := evalRing(w, ring)
	try := func(cand []int) bool {
		if s := evalRing(w, cand); s.better(cur) {
			copy(ring, cand)
			cur = s
			return true
		}
		return false
	}
	cand := make([]int, n)
	for improved := true; improved; {
		improved = false
		for i := 1; i < n-1; i++ {
			for j := i + 1; j < n; j++ {
				copy(cand, ring)
				slices.Reverse(cand[i : j+1])
				improved = try(cand) || improved
			}
		}
		for length := 1; length <= 3 && length < n-1; length++ {
			for i := 1; i+length <= n; i++ {
				for k := 1; k <= n-length; k++ {
					if k == i {
						continue
					}
					for _, turned := range []bool{false, true} {
						moveStretch(cand, ring, i, length, k, turned)
						improved = try(cand) || improved
					}
				}
			}
		}
	}
}

// moveStretch writes to dst the ring with its stretch ring[i:i+length]
// taken out and put back (turned round if asked) at index k of what is
// left.
func moveStretch(dst, ring []int, i, length, k int, turned bool) {
	at := 0
	rest := func(from, to int) {
		for r := from; r < to; r++ {
			if r >= i {
				dst[at] = ring[r+length]
			} else {
				dst[at] = ring[r]
			}
			at++
		}
	}
	rest(0, k)
	for s := range length {
		if turned {
			dst[at] = ring[i+length-1-s]
		} else {
			dst[at] = ring[i+s]
		}
		at++
	}
	rest(k, len(ring)-length)
}

// canonical rotates ring to start at its lowest GPU and turns it to the
// direction whose second GPU is the lower: the lexicographically smallest
// way to write the same ring.
func canonical(ring []int) []int {
	n := len(ring)
	at := slices.Index(ring, slices.Min(ring))
	out := append(slices.Clone(ring[at:]), ring[:at]...)
	if n > 2 && out[1] > out[n-1] {
		slices.Reverse(out[1:])
	}
	return out
}

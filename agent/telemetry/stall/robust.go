package stall

import (
	"math"
	"slices"
	"time"
)

// madScale makes the median absolute deviation estimate the standard
// deviation of normally distributed data (1/Φ⁻¹(3/4)), so that K means
// about "K standard deviations" while one wild value cannot move it.
const madScale = 1.4826

// medianOf returns the median of ds (the mean of the middle two for an
// even count), 0 when empty. ds is not modified.
func medianOf(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return sortedMedian(s)
}

func sortedMedian(s []time.Duration) time.Duration {
	n := len(s)
	switch {
	case n == 0:
		return 0
	case n%2 == 1:
		return s[n/2]
	}
	return s[n/2-1] + (s[n/2]-s[n/2-1])/2
}

// spread returns the median of sorted (ascending) and madScale times its
// median absolute deviation: a robust centre and standard deviation.
func spread(sorted []time.Duration) (median, sigma time.Duration) {
	median = sortedMedian(sorted)
	dev := make([]time.Duration, len(sorted))
	for i, d := range sorted {
		dev[i] = max(d-median, median-d)
	}
	slices.Sort(dev)
	return median, time.Duration(madScale * float64(sortedMedian(dev)))
}

// binomTail is P(X >= k) for X ~ Binomial(n, p): how likely a rank is to be
// the straggler of k or more of n steps by chance alone, when each of the
// job's p = 1/W ranks is equally likely to be. Summed in log space, exact
// enough for the n of a window (a few hundred at most).
func binomTail(n, k int, p float64) float64 {
	switch {
	case k <= 0:
		return 1
	case k > n:
		return 0
	case p <= 0:
		return 0
	case p >= 1:
		return 1
	}
	lp, lq := math.Log(p), math.Log1p(-p)
	lgn, _ := math.Lgamma(float64(n + 1))
	sum := 0.0
	for i := k; i <= n; i++ {
		lgi, _ := math.Lgamma(float64(i + 1))
		lgni, _ := math.Lgamma(float64(n - i + 1))
		sum += math.Exp(lgn - lgi - lgni + float64(i)*lp + float64(n-i)*lq)
	}
	return min(sum, 1)
}

package webhook

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	defaultBackoffBase = 200 * time.Millisecond
	maxBackoff         = 10 * time.Second
)

// backoff is the wait before retry n (0 for the first): base doubled n
// times, at most maxBackoff, scaled by 0.5 + jitter/2 for jitter in
// [0, 1), so that the nodes of a job that all hit one failing endpoint
// at once do not all retry at once.
func backoff(n int, jitter float64, base time.Duration) time.Duration {
	d := base
	for i := 0; i < n && d < maxBackoff; i++ {
		d *= 2
	}
	d = min(d, maxBackoff)
	return time.Duration(float64(d) * (0.5 + jitter/2))
}

// retryable says whether a response of this status is worth another try:
// a 5xx (the endpoint's trouble, likely passing) or a 429 (asked to wait).
// Any other 4xx is the request's fault and fails again; a 3xx left over
// after the client's redirects too.
func retryable(status int) bool {
	return status == http.StatusTooManyRequests || status >= 500
}

// retryAfter reads a Retry-After header: seconds, or an HTTP date (taken
// against now). ok is false when there is none or it is not one.
func retryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseInt(v, 10, 64); err == nil {
		if s < 0 {
			return 0, false
		}
		return time.Duration(min(s, int64(24*time.Hour/time.Second))) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

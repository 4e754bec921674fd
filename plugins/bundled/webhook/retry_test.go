package webhook

import (
	"net/http"
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	base := 200 * time.Millisecond
	for _, tc := range []struct {
		n      int
		jitter float64
		want   time.Duration
	}{
		{0, 0, 100 * time.Millisecond}, {0, 0.999999, 200 * time.Millisecond},
		{1, 0, 200 * time.Millisecond}, {2, 0.5, 600 * time.Millisecond},
		{10, 0, maxBackoff / 2}, {60, 0.999999, maxBackoff},
	} {
		if got := backoff(tc.n, tc.jitter, base).Round(time.Millisecond); got != tc.want {
			t.Errorf("backoff(%d, %v) = %s, want %s", tc.n, tc.jitter, got, tc.want)
		}
	}
}

func TestRetryable(t *testing.T) {
	for status, want := range map[int]bool{
		200: false, 301: false, 400: false, 401: false, 404: false, 409: false, 413: false,
		429: true, 500: true, 502: true, 503: true, 504: true,
	} {
		if got := retryable(status); got != want {
			t.Errorf("retryable(%d) = %v", status, got)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	now := time.Date(2026, 11, 26, 3, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		v    string
		want time.Duration
		ok   bool
	}{
		{"", 0, false}, {"soon", 0, false}, {"-1", 0, false},
		{"0", 0, true}, {" 2 ", 2 * time.Second, true}, {"120", 2 * time.Minute, true},
		{"99999999999", 24 * time.Hour, true},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second, true},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0, true},
	} {
		got, ok := retryAfter(tc.v, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("retryAfter(%q) = %s, %v; want %s, %v", tc.v, got, ok, tc.want, tc.ok)
		}
	}
}

// Package wiretime is how the plugin protocol carries a time: Unix
// nanoseconds, with 0 for none (time.Time{}.UnixNano() is not 0). The
// detector's findings and the notifier's events share it.
package wiretime

import "time"

// To is t on the wire.
func To(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// From is the time ns stands for.
func From(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

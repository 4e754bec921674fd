package health

import (
	"log/slog"
	"time"
)

// Option configures a Watcher.
type Option func(*Watcher)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(w *Watcher) {
		if l != nil {
			w.logger = l
		}
	}
}

// WithInterval sets how often the watcher polls what NVML has no
// events for (default 10s); d <= 0 keeps the default.
func WithInterval(d time.Duration) Option {
	return func(w *Watcher) {
		if d > 0 {
			w.interval = d
		}
	}
}

// WithRanks sets the function that names the global ranks on a GPU
// (by NVML index); it is called each time a finding is made, so it may
// answer differently from one generation to the next. It is called from the
// watcher's goroutines: it must be safe for concurrent use and not block.
func WithRanks(ranks func(gpu int) []int) Option {
	return func(w *Watcher) { w.ranks = ranks }
}

// WithClock sets the clock that stamps findings (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(w *Watcher) {
		if now != nil {
			w.now = now
		}
	}
}

// WithTemperatureLimit sets the GPU temperature, in °C, at or above
// which the watcher warns. By default it is 5 °C below the GPU's slowdown
// threshold, or 85 °C where NVML does not give that threshold.
func WithTemperatureLimit(celsius uint32) Option {
	return func(w *Watcher) { w.tempLimit = celsius }
}

// WithNVLinkErrorLimit sets how many NVLink errors (replay, recovery,
// CRC and ECC counters, all links of a GPU together) within one poll
// interval turn the NVLink warning into ActionResetGPU (default 100; 0
// keeps the default). Any growth below it is a warning.
func WithNVLinkErrorLimit(n uint64) Option {
	return func(w *Watcher) {
		if n > 0 {
			w.nvlinkLimit = n
		}
	}
}

// WithXIDActions overrides the action of some XIDs (see XIDCatalog);
// the map is copied.
func WithXIDActions(actions map[uint64]Action) Option {
	return func(w *Watcher) {
		for code, a := range actions {
			w.xidActions[code] = a
		}
	}
}

package pluginhost

import (
	"context"
	"io"
	"log"
	"log/slog"
	"sync/atomic"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/time/rate"
)

// hclogAdapter hands go-plugin's log lines (its own, and the plugin's
// stderr, which go-plugin parses) to the agent's slog logger, so a
// plugin's last words before a crash are in the agent's log.
type hclogAdapter struct {
	l     *slog.Logger
	name  string
	args  []any
	level hclog.Level
	lines *lineBudget // shared by the adapter's copies (With, Named)
}

// A plugin's lines are logged at most lineRate a second on average, in
// bursts of up to lineBurst, each cut to lineMax bytes: the rest are
// counted, and the next line logged says how many. A plugin writing its
// stderr as fast as it could took half a core of the agent.
const (
	lineRate  = 10
	lineBurst = 50
	lineMax   = 1024
)

// lineBudget is a plugin's allowance of log lines.
type lineBudget struct {
	limit   *rate.Limiter
	dropped atomic.Int64
}

// take reports whether a line may be logged now, and how many were not
// since the last one that was.
func (b *lineBudget) take() (ok bool, dropped int64) {
	if !b.limit.Allow() {
		b.dropped.Add(1)
		return false, 0
	}
	return true, b.dropped.Swap(0)
}

// quietGoPlugin reports go-plugin's own lines about a plugin's end, which
// the agent's line about the failure already says.
func quietGoPlugin(msg string) bool {
	switch msg {
	case "plugin failed to exit gracefully", "plugin process exited", "plugin exited":
		return true
	}
	return false
}

func newHCLog(l *slog.Logger, name string) hclog.Logger {
	return &hclogAdapter{l: l, name: name, level: hclog.Debug, lines: &lineBudget{limit: rate.NewLimiter(lineRate, lineBurst)}}
}

func slogLevel(level hclog.Level) slog.Level {
	switch level {
	case hclog.Trace, hclog.Debug:
		return slog.LevelDebug
	case hclog.Info, hclog.NoLevel, hclog.DefaultLevel:
		return slog.LevelInfo
	case hclog.Warn:
		return slog.LevelWarn
	}
	return slog.LevelError
}

func (h *hclogAdapter) Log(level hclog.Level, msg string, args ...interface{}) {
	if level == hclog.NoLevel || level == hclog.DefaultLevel {
		level = hclog.Info
	}
	if level < h.level {
		return
	}
	if quietGoPlugin(msg) {
		level = hclog.Debug // the agent says it once, with the reason: "plugin failed; restarting it"
	}
	if !h.l.Enabled(context.Background(), slogLevel(level)) {
		return
	}
	ok, dropped := h.lines.take()
	if !ok {
		return
	}
	all := append(append([]any{"plugin", h.name}, h.args...), args...)
	for i := 2; i+1 < len(all); i += 2 {
		if all[i] == "plugin" {
			all[i] = "plugin_path" // go-plugin's own "plugin" is the executable
		}
	}
	for i, a := range all {
		if s, isStr := a.(string); isStr && len(s) > lineMax {
			all[i] = clip(s, lineMax)
		}
	}
	if dropped > 0 {
		all = append(all, "lines_not_logged", dropped)
	}
	h.l.Log(context.Background(), slogLevel(level), clip(msg, lineMax), all...)
}

func (h *hclogAdapter) Trace(msg string, args ...interface{}) { h.Log(hclog.Trace, msg, args...) }
func (h *hclogAdapter) Debug(msg string, args ...interface{}) { h.Log(hclog.Debug, msg, args...) }
func (h *hclogAdapter) Info(msg string, args ...interface{})  { h.Log(hclog.Info, msg, args...) }
func (h *hclogAdapter) Warn(msg string, args ...interface{})  { h.Log(hclog.Warn, msg, args...) }
func (h *hclogAdapter) Error(msg string, args ...interface{}) { h.Log(hclog.Error, msg, args...) }
func (h *hclogAdapter) IsTrace() bool                         { return h.enabled(hclog.Trace) }
func (h *hclogAdapter) IsDebug() bool                         { return h.enabled(hclog.Debug) }
func (h *hclogAdapter) IsInfo() bool                          { return h.enabled(hclog.Info) }
func (h *hclogAdapter) IsWarn() bool                          { return h.enabled(hclog.Warn) }
func (h *hclogAdapter) IsError() bool                         { return h.enabled(hclog.Error) }
func (h *hclogAdapter) ImpliedArgs() []interface{}            { return h.args }
func (h *hclogAdapter) Name() string                          { return h.name }
func (h *hclogAdapter) SetLevel(level hclog.Level)            { h.level = level }
func (h *hclogAdapter) GetLevel() hclog.Level                 { return h.level }

func (h *hclogAdapter) enabled(level hclog.Level) bool {
	return level >= h.level && h.l.Enabled(context.Background(), slogLevel(level))
}

func (h *hclogAdapter) With(args ...interface{}) hclog.Logger {
	c := *h
	c.args = append(append([]any(nil), h.args...), args...)
	return &c
}

// Named keeps the plugin's name: go-plugin names its stderr logger after
// the binary, which says less than the --plugin name.
func (h *hclogAdapter) Named(string) hclog.Logger      { c := *h; return &c }
func (h *hclogAdapter) ResetNamed(string) hclog.Logger { c := *h; return &c }

func (h *hclogAdapter) StandardLogger(*hclog.StandardLoggerOptions) *log.Logger {
	return slog.NewLogLogger(h.l.Handler(), slog.LevelInfo)
}

func (h *hclogAdapter) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return h.StandardLogger(nil).Writer()
}

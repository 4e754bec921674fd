package store

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// zapLogger returns a zap logger that forwards warn-and-above entries to
// logger, so etcd (which only speaks zap) never writes to the terminal on its
// own. Info and debug are dropped: etcd is chatty at info and the agent's log
// should show only what needs attention. A nil logger discards everything.
func zapLogger(logger *slog.Logger) *zap.Logger {
	lg, _ := serverZapLogger(logger)
	return lg
}

// serverZapLogger is zapLogger for an embedded server, with a switch that
// demotes everything to debug once the server is being closed: etcd logs
// its listeners shutting down as errors ("setting up serving from embedded
// etcd failed ... server closed"), which on a clean Close are expected.
func serverZapLogger(logger *slog.Logger) (lg *zap.Logger, closing *atomic.Bool) {
	closing = new(atomic.Bool)
	if logger == nil {
		return zap.NewNop(), closing
	}
	// etcd calls Fatal on conditions it cannot serve through (its data dir
	// deleted under it); zap would then exit the process, taking the agent
	// and its workers down without a word. Ending only the goroutine keeps
	// the agent alive to report the store's failure through its clients.
	return zap.New(&slogCore{logger: logger, quiet: closing}, zap.WithFatalHook(zapcore.WriteThenGoexit)), closing
}

// benign reports whether msg is one of the warnings or errors that etcd
// logs when all is well with an embedded server configured as we do. Shown
// at their level they would only teach users to ignore the log, so they go
// to debug.
func benign(msg string) bool {
	switch msg {
	case "Running http and grpc server on single port. This is not recommended for production.":
		// Deliberate: the agent needs no HTTP API, and one port is simpler.
		return true
	case "simple token is not cryptographically signed":
		// Tokens only matter with etcd auth, which the embedded store
		// never enables.
		return true
	case "lost TCP streaming connection with remote peer", "closed TCP streaming connection with remote peer",
		"peer became inactive (message send to peer failed)", "rejected stream from remote peer because it was removed",
		"prober detected unhealthy status", "failed to reach the peer URL", "failed to get version",
		// The replica manager adding a member before the cluster has
		// been connected long enough: it tries again a second later.
		"rejecting member add request; local member has not been connected to majority peers, reconfigure breaks active quorum":
		// A replicated store's member whose agent died: each of the others
		// says so a dozen ways, every few seconds, until it is removed.
		// The replica manager (replica.go) logs the removal once.
		return true
	case "data-dir used by this member must be removed":
		// A member that left the cluster (its agent handed it over, or the
		// others removed it): etcd stops it with these. The replica
		// manager says which and why.
		return true
	case "retrying of unary invoker failed":
		// etcd's client, on each failed attempt of a request it retries
		// (a member being promoted, a leader being elected): the request's
		// own error, if it fails for good, is what the caller reports.
		return true
	case "rejecting promote learner: learner is not ready":
		// The replica manager promotes a new member as soon as it joins,
		// and again until its log has caught up with the leader's, which
		// a job's start saw every time; etcd logs each early try as an
		// error.
		return true
	case "Failed to detect schema version", "failed to update storage version":
		// A startup race in etcd (see BackendBatchInterval in server.go),
		// retried by etcd seconds later. The storage version only matters
		// for upgrading a data dir, and ours never outlive the process.
		return true
	}
	return false
}

// benignRejection reports whether etcd's entry is a membership change it
// refused in a way the replica manager expects and retries: two agents
// adding a learner at once (etcd admits one at a time), which a job of
// three nodes does at its start. etcd logs it as an error.
func benignRejection(msg string, fields []zapcore.Field) bool {
	if msg != "Validation on configuration change failed" {
		return false
	}
	for _, f := range fields {
		if f.Key == "error" {
			if err, ok := f.Interface.(error); ok && strings.Contains(err.Error(), "too many learner members") {
				return true
			}
		}
	}
	return false
}

// slogCore is a zapcore.Core writing to a slog.Logger.
type slogCore struct {
	logger *slog.Logger
	quiet  *atomic.Bool // when set, every entry goes to debug
	attrs  []slog.Attr  // fields added with With
}

func (c *slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.WarnLevel }

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	attrs := make([]slog.Attr, 0, len(c.attrs)+len(fields))
	attrs = append(attrs, c.attrs...)
	attrs = append(attrs, fieldAttrs(fields)...)
	return &slogCore{logger: c.logger, quiet: c.quiet, attrs: attrs}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := slog.LevelWarn
	switch {
	case e.Level >= zapcore.DPanicLevel:
		level = slog.LevelError // never hidden, even while closing
	case c.quiet.Load() || benign(e.Message) || benignRejection(e.Message, fields):
		level = slog.LevelDebug
	case e.Level > zapcore.WarnLevel:
		level = slog.LevelError
	}
	ctx := context.Background()
	h := c.logger.Handler()
	if !h.Enabled(ctx, level) {
		return nil
	}
	r := slog.NewRecord(e.Time, level, e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(c.attrs...)
	r.AddAttrs(fieldAttrs(fields)...)
	return h.Handle(ctx, r)
}

func (c *slogCore) Sync() error { return nil }

// fieldAttrs turns zap fields into slog attributes. zap's map encoder does
// the type switch over field kinds for us (errors become strings, durations
// stay durations, and so on). One encoder per field keeps the order of the
// fields and catches the extra keys some fields add (errorVerbose).
func fieldAttrs(fields []zapcore.Field) []slog.Attr {
	attrs := make([]slog.Attr, 0, len(fields))
	for _, f := range fields {
		enc := zapcore.NewMapObjectEncoder()
		f.AddTo(enc)
		for k, v := range enc.Fields {
			attrs = append(attrs, slog.Any(k, v))
		}
	}
	return attrs
}

package export

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Stragglers takes the persistent stragglers named now in generation gen
// (the watch's look, about every second). Each rank newly named, or named
// with another cause, becomes a span "persistent straggler" on the
// rank's resource with its cause and evidence (and an instant in the
// trace file); the gauge
// ddp.stragglers is 1 for each named rank, by ddp.rank and ddp.cause, and 0 once
// it is no longer named; stalls whose straggler is named carry its cause.
func (e *Exporter) Stragglers(gen uint64, sts []telemetry.Straggler) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	now := time.Now()
	named := make(map[int]telemetry.Cause, len(sts))
	for _, st := range sts {
		named[st.Rank] = st.Cause
		old, was := e.named[st.Rank]
		if was && old != st.Cause {
			e.inst.stragglers.Record(e.ctx, 0, stragglerSet(st.Rank, old))
		}
		e.inst.stragglers.Record(e.ctx, 1, stragglerSet(st.Rank, st.Cause))
		if !was || old != st.Cause {
			e.exportStraggler(gen, st, now)
		}
	}
	for r, c := range e.named {
		if _, ok := named[r]; !ok {
			e.inst.stragglers.Record(e.ctx, 0, stragglerSet(r, c))
		}
	}
	e.named = named
	e.flushFile()
}

func stragglerSet(rank int, cause telemetry.Cause) metric.RecordOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.Int("ddp.rank", rank), attribute.String("ddp.cause", string(cause))))
}

// causeAttrs is the cause of the stall's straggler when it is a named
// persistent straggler.
func (e *Exporter) causeAttrs(s *telemetry.Stall) []attribute.KeyValue {
	if c, ok := e.named[s.Straggler]; ok {
		return []attribute.KeyValue{attribute.String("ddp.cause", string(c))}
	}
	return nil
}

// exportStraggler exports st's naming as a span of its own trace, and an
// instant in the trace file.
func (e *Exporter) exportStraggler(gen uint64, st telemetry.Straggler, now time.Time) {
	name := fmt.Sprintf("persistent straggler: rank %d", st.Rank) // the trace file's
	if e.tr != nil {
		tid := trace.TraceID(digest(e.traceJob(), kindStraggler, gen, uint64(now.UnixNano()))[:16])
		ctx := withIDs(e.ctx, tid, spanID(tid, "straggler"))
		w := e.worker(st.Rank)
		attrs := append(e.withRun(workerAttrs(w)...),
			attribute.Int64("ddp.generation", int64(gen)),
			attribute.Int("ddp.straggler.rank", st.Rank),
			attribute.String("ddp.cause", string(st.Cause)),
			attribute.String("ddp.cause.evidence", st.Evidence),
			attribute.Float64("ddp.straggler.late", st.Late.Seconds()),
			attribute.Float64("ddp.share", st.Share),
			attribute.Float64("ddp.p", st.P),
			attribute.Int("ddp.steps.last", st.Last),
			attribute.Int("ddp.steps.window", st.Steps))
		_, span := e.rankTracer(w).Start(ctx, "persistent straggler", trace.WithNewRoot(), trace.WithTimestamp(now), trace.WithAttributes(attrs...))
		span.End(trace.WithTimestamp(now))
	}
	if e.file != nil && e.file.f != nil {
		e.file.add(event{Name: name, Cat: "straggler", Ph: "i", Scope: "g", TS: micros(now), PID: jobPID, TID: 0,
			Args: map[string]any{"generation": gen, "rank": st.Rank, "cause": string(st.Cause), "evidence": st.Evidence,
				"late_ms": ms(st.Late), "share": st.Share}})
	}
}

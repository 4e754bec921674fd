package export

import (
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Reformed exports an in-process re-formation, whatever the sampling: it
// is counted (ddp.reforms) and timed (ddp.reform.duration), and traced as
// a span "re-formed in process" of its own trace, from the fault to now,
// with a child span per phase; the trace file gets it as a slice.
func (e *Exporter) Reformed(rf telemetry.Reform) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	now := time.Now()
	took := rf.Took()
	e.inst.reforms.Add(e.ctx, 1)
	e.inst.reformTime.Record(e.ctx, took.Seconds())
	from := now.Add(-took)
	const name = "re-formed in process"
	if e.tr != nil {
		tid := trace.TraceID(digest(e.traceJob(), kindReform, rf.Gen, uint64(rf.N)))
		attrs := e.withRun(
			attribute.Int64("ddp.generation", int64(rf.Gen)), attribute.Int("ddp.reform", rf.N),
			attribute.Int("ddp.rank", rf.Rank), attribute.Int64("ddp.step", rf.Step),
			attribute.Int64("ddp.reform.resume", rf.Resume), attribute.Int("ddp.reform.source", rf.Source),
			attribute.Int64("ddp.reform.lost_steps", rf.Lost()), attribute.String("ddp.reform.error", rf.Error),
		)
		ctx, span := e.tr.agentT.Start(withIDs(e.ctx, tid, spanID(tid, "root")), name, trace.WithNewRoot(),
			trace.WithTimestamp(from), trace.WithAttributes(attrs...))
		at := from
		for _, p := range rf.Phases {
			_, ps := e.tr.agentT.Start(withIDs(ctx, tid, spanID(tid, p.Name)), p.Name, trace.WithTimestamp(at))
			at = at.Add(p.Took)
			ps.End(trace.WithTimestamp(at))
		}
		span.End(trace.WithTimestamp(now))
	}
	if e.file != nil && e.file.f != nil {
		phases := map[string]any{}
		for _, p := range rf.Phases {
			phases[p.Name+"_ms"] = float64(p.Took) / float64(time.Millisecond)
		}
		e.file.add(event{Name: name, Cat: "reform", Ph: "X", TS: micros(from), Dur: dur(took), PID: jobPID, TID: 0,
			Args: map[string]any{"generation": rf.Gen, "reform": rf.N, "step": rf.Step, "resume": rf.Resume,
				"source": rf.Source, "error": rf.Error, "phases": phases}})
	}
	e.flushFile()
}

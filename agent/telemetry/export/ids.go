package export

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TraceID is the trace id of a step: the first 16 bytes of
// sha256(job || 0x00 || gen || step), gen and step as 8-byte big-endian
// integers, job as TraceJob gives it. Every agent and every re-export
// computes the same id, so the spans of all ranks of one step land in one
// trace.
func TraceID(job string, gen, step uint64) [16]byte {
	return [16]byte(digest(job, kindStep, gen, step))
}

// TraceJob is what trace ids hash for the job: its id, and the run's
// ("job/run"; the job id alone without a run). Job ids have no "/".
func TraceJob(job, run string) string {
	if run == "" {
		return job
	}
	return job + "/" + run
}

// SetRun names the run of the job that the next traces belong to (the
// rendezvous' Round.Run, the same on every node): a job id reused by
// another run gets other trace ids, where a trace viewer merged the runs'
// steps into one trace. "" derives them from the job id alone.
func (e *Exporter) SetRun(run string) { e.run.Store(&run) }

// traceJob is TraceJob of this exporter's job and run.
func (e *Exporter) traceJob() string { return TraceJob(e.cfg.JobID, e.runID()) }

func (e *Exporter) runID() string {
	if p := e.run.Load(); p != nil {
		return *p
	}
	return ""
}

// withRun is attrs and, with a run, ddp.run: the root spans carry it, so
// that a trace search can keep to one run of a job id.
func (e *Exporter) withRun(attrs ...attribute.KeyValue) []attribute.KeyValue {
	if run := e.runID(); run != "" {
		return append(attrs, attribute.String("ddp.run", run))
	}
	return attrs
}

// The kinds of trace the exporter derives ids for: the byte after the
// job id, so that no two kinds share an id.
const (
	kindStep      byte = 0
	kindRestart   byte = 1 // exportFault's, which hashes the generation alone
	kindStraggler byte = 2
	kindReform    byte = 3 // an in-process re-formation: generation and number
)

// digest is sha256(job || kind || a || b), a and b as 8-byte big-endian
// integers.
func digest(job string, kind byte, a, b uint64) []byte {
	h := sha256.New()
	h.Write([]byte(job))
	var buf [17]byte
	buf[0] = kind
	binary.BigEndian.PutUint64(buf[1:9], a)
	binary.BigEndian.PutUint64(buf[9:], b)
	h.Write(buf[:])
	return h.Sum(nil)
}

// spanID derives a span id from a trace id and a name for the span within
// the trace ("root", "rank 3 bucket 1", ...), so a re-export gives every
// span the id it had.
func spanID(tid trace.TraceID, name string) trace.SpanID {
	h := sha256.New()
	h.Write(tid[:])
	h.Write([]byte(name))
	sid := trace.SpanID(h.Sum(nil)[:8])
	if !sid.IsValid() {
		sid[7] = 1
	}
	return sid
}

// sampled reports whether a step with trace id tid is kept at ratio: the
// last 8 bytes of the id, read as a fraction of 2^64, are below ratio. The
// choice depends on the id alone, like the SDK's TraceIDRatioBased.
func sampled(tid trace.TraceID, ratio float64) bool {
	switch {
	case ratio >= 1:
		return true
	case ratio <= 0:
		return false
	}
	u := binary.BigEndian.Uint64(tid[8:]) >> 11
	return float64(u)/(1<<53) < ratio
}

// wantIDs is what a context asks the next span started under it to get.
type wantIDs struct {
	trace trace.TraceID // for a root span
	span  trace.SpanID
}

type idsKey struct{}

func withIDs(ctx context.Context, tid trace.TraceID, sid trace.SpanID) context.Context {
	return context.WithValue(ctx, idsKey{}, wantIDs{trace: tid, span: sid})
}

// idGenerator hands out the ids a context asks for (withIDs), random ones
// otherwise.
type idGenerator struct{}

var _ sdktrace.IDGenerator = idGenerator{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if w, ok := ctx.Value(idsKey{}).(wantIDs); ok && w.trace.IsValid() && w.span.IsValid() {
		return w.trace, w.span
	}
	var tid trace.TraceID
	for !tid.IsValid() {
		binary.NativeEndian.PutUint64(tid[:8], rand.Uint64())
		binary.NativeEndian.PutUint64(tid[8:], rand.Uint64())
	}
	return tid, randomSpanID()
}

func (idGenerator) NewSpanID(ctx context.Context, _ trace.TraceID) trace.SpanID {
	if w, ok := ctx.Value(idsKey{}).(wantIDs); ok && w.span.IsValid() {
		return w.span
	}
	return randomSpanID()
}

func randomSpanID() trace.SpanID {
	var sid trace.SpanID
	for !sid.IsValid() {
		binary.NativeEndian.PutUint64(sid[:], rand.Uint64())
	}
	return sid
}

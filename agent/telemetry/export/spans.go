package export

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// maxStack is the most of a Python stack a hang span carries per rank.
const maxStack = 16 << 10

func (e *Exporter) traceID(k stepKey) trace.TraceID {
	return trace.TraceID(TraceID(e.traceJob(), k.gen, k.step))
}

// rootContext is the span context of step k's root span, for its children.
func (e *Exporter) rootContext(k stepKey) trace.SpanContext {
	tid := e.traceID(k)
	return trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: tid, SpanID: spanID(tid, "root"), TraceFlags: trace.FlagsSampled,
	})
}

// start starts a span of tracer tr with the given id: a root span of step
// k when child is false, else a child of the step's root.
func (e *Exporter) start(tr trace.Tracer, k stepKey, id string, child bool, name string, at time.Time, attrs ...attribute.KeyValue) trace.Span {
	root := e.rootContext(k)
	ctx := e.ctx
	opts := []trace.SpanStartOption{trace.WithTimestamp(at), trace.WithAttributes(attrs...)}
	if child {
		ctx = trace.ContextWithSpanContext(ctx, root)
		ctx = withIDs(ctx, root.TraceID(), spanID(root.TraceID(), id))
	} else {
		ctx = withIDs(ctx, root.TraceID(), root.SpanID())
		opts = append(opts, trace.WithNewRoot())
	}
	_, span := tr.Start(ctx, name, opts...)
	return span
}

// rankTracer is the tracer of the spans of worker w: its rank's resource.
func (e *Exporter) rankTracer(w telemetry.Worker) trace.Tracer { return e.tr.rank(w.Rank, w.Host) }

func (e *Exporter) worker(rank int) telemetry.Worker {
	if e.cfg.Worker != nil {
		if w := e.cfg.Worker(rank); w.Rank == rank {
			return w
		}
	}
	return telemetry.Worker{Rank: rank, LocalRank: -1, GPUIndex: -1}
}

func workerAttrs(w telemetry.Worker) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		attribute.Int("ddp.rank", w.Rank),
		attribute.Int("ddp.local_rank", w.LocalRank),
		attribute.String("host.name", w.Host),
	}
	if w.PID != 0 {
		attrs = append(attrs, attribute.Int("process.pid", w.PID))
	}
	if w.GPU != "" {
		attrs = append(attrs, attribute.String("gpu.uuid", w.GPU))
	}
	return attrs
}

// bandwidth is a collective's throughput as nccl-tests computes it, from
// the fastest rank's time in it: algbw = bytes / time, busbw = algbw ×
// 2(n−1)/n for an all-reduce over n ranks; in bytes per second. Both are 0
// when the time is.
type bandwidth struct {
	fastest      time.Duration
	algbw, busbw float64
}

func bandwidthOf(c telemetry.Collective) bandwidth {
	var b bandwidth
	for i, r := range c.Records {
		if d := r.End.Sub(r.Start); i == 0 || d < b.fastest {
			b.fastest = d
		}
	}
	if b.fastest <= 0 {
		return bandwidth{}
	}
	n := float64(len(c.Records))
	b.algbw = float64(c.Bytes) / b.fastest.Seconds()
	b.busbw = b.algbw * 2 * (n - 1) / n
	return b
}

// extent is the time from the first arrival to the last end over cs.
func extent(cs []telemetry.Collective) (from, to time.Time) {
	for _, c := range cs {
		for _, r := range c.Records {
			if from.IsZero() || (!r.Arrive.IsZero() && r.Arrive.Before(from)) {
				from = r.Arrive
			}
			if r.End.After(to) {
				to = r.End
			}
		}
	}
	return from, to
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// stallAttrs are a stall's attributes, times in seconds: OpenTelemetry
// keeps units out of attribute names (docs/stalls-and-traces.md lists
// them with their units).
func stallAttrs(s *telemetry.Stall) []attribute.KeyValue {
	return []attribute.KeyValue{
		attribute.Int("ddp.straggler.rank", s.Straggler),
		attribute.Float64("ddp.stall.late", s.Late.Seconds()),
		attribute.Int("ddp.waiters", s.Waiters),
		attribute.Float64("ddp.stall.waited", s.Waited.Seconds()),
		attribute.Float64("ddp.stall.threshold", s.Threshold.Seconds()),
		attribute.Float64("ddp.stall.median", s.Median.Seconds()),
	}
}

// stragglerArrival is when the straggler of c arrived.
func stragglerArrival(c telemetry.Collective) time.Time {
	for _, r := range c.Records {
		if r.Rank == c.Stall.Straggler {
			return r.Arrive
		}
	}
	_, to := extent([]telemetry.Collective{c})
	return to
}

// exportStep exports step k: its root span over cs, and cs.
func (e *Exporter) exportStep(k stepKey, cs []telemetry.Collective) {
	from, to := extent(cs)
	e.exportRoot(k, from, to, cs)
	for _, c := range cs {
		e.exportCollective(k, c)
	}
}

// exportRoot exports the root span "step" of step k from..to, on the
// agent's resource, with a "stall" event per stalled collective of cs.
func (e *Exporter) exportRoot(k stepKey, from, to time.Time, cs []telemetry.Collective) {
	stalls := 0
	for _, c := range cs {
		if c.Stall != nil {
			stalls++
		}
	}
	if e.tr != nil {
		span := e.start(e.tr.agentT, k, "root", false, "step", from, e.withRun(
			attribute.Int64("ddp.step", int64(k.step)),
			attribute.Int64("ddp.generation", int64(k.gen)),
			attribute.Int("ddp.collectives", len(cs)),
			attribute.Int("ddp.stalls", stalls))...)
		for _, c := range cs {
			if c.Stall != nil {
				span.AddEvent("stall", trace.WithTimestamp(stragglerArrival(c)),
					trace.WithAttributes(append(append(stallAttrs(c.Stall), e.causeAttrs(c.Stall)...), attribute.Int("ddp.bucket", int(c.Bucket)))...))
			}
		}
		span.End(trace.WithTimestamp(to))
	}
	if e.file != nil {
		e.file.use(k.gen)
		e.file.add(event{Name: "step " + strconv.FormatUint(k.step, 10), Cat: "step", Ph: "X", TS: micros(from), Dur: dur(to.Sub(from)), PID: jobPID, TID: 0,
			Args: map[string]any{"step": k.step, "generation": k.gen, "collectives": len(cs), "stalls": stalls}})
	}
}

// exportCollective exports one span "allreduce" per rank of c under its
// step's root, each on its rank's resource. In a stall the straggler's
// span has ddp.straggler=true and a "stall" event, the others'
// ddp.waited_for.rank naming it (their bars are the long ones: they
// waited), and the straggler's rank gets a span "stall" (exportStall).
func (e *Exporter) exportCollective(k stepKey, c telemetry.Collective) {
	bw := bandwidthOf(c)
	dtype := dtypeName(c.DType)
	if e.file != nil {
		e.file.use(k.gen)
	}
	for _, r := range c.Records {
		w := e.worker(r.Rank)
		wait := r.End.Sub(r.Start) - bw.fastest
		status := statusName(r.Status)
		straggler := c.Stall != nil && c.Stall.Straggler == r.Rank
		if e.tr != nil {
			attrs := append(workerAttrs(w),
				attribute.Int("ddp.bucket", int(c.Bucket)),
				attribute.Int64("ddp.step", int64(c.Step)),
				attribute.Int64("ddp.generation", int64(c.Gen)),
				attribute.Int64("ddp.bytes", int64(c.Bytes)),
				attribute.String("ddp.dtype", dtype),
				attribute.Float64("ddp.wait", wait.Seconds()),
				attribute.Float64("ddp.allreduce.algbw", bw.algbw),
				attribute.Float64("ddp.allreduce.busbw", bw.busbw),
				attribute.String("ddp.status", status))
			switch {
			case straggler:
				attrs = append(attrs, attribute.Bool("ddp.straggler", true))
			case c.Stall != nil:
				attrs = append(attrs, attribute.Int("ddp.waited_for.rank", c.Stall.Straggler))
			}
			span := e.start(e.rankTracer(w), k, fmt.Sprintf("rank %d bucket %d", r.Rank, c.Bucket), true, "allreduce", r.Start, attrs...)
			if r.Status != 0 {
				span.SetStatus(codes.Error, status)
			}
			if straggler {
				span.AddEvent("stall", trace.WithTimestamp(r.Arrive), trace.WithAttributes(append(stallAttrs(c.Stall), e.causeAttrs(c.Stall)...)...))
			}
			span.End(trace.WithTimestamp(r.End))
		}
		if e.file != nil {
			pid, tid := e.file.thread(r.Rank, w.Host, w.GPU)
			e.file.add(event{Name: "allreduce bucket " + strconv.FormatUint(uint64(c.Bucket), 10), Cat: "allreduce", Ph: "X",
				TS: micros(r.Start), Dur: dur(r.End.Sub(r.Start)), PID: pid, TID: tid,
				Args: map[string]any{"rank": r.Rank, "bucket": c.Bucket, "step": c.Step, "generation": c.Gen,
					"bytes": c.Bytes, "dtype": dtype, "wait_ms": ms(wait), "algbw_gbps": bw.algbw / 1e9, "busbw_gbps": bw.busbw / 1e9,
					"status": status, "arrive_us": micros(r.Arrive)}})
			if straggler {
				e.file.add(event{Name: "stall", Cat: "stall", Ph: "i", Scope: "t", TS: micros(r.Arrive), PID: pid, TID: tid,
					Args: stallArgs(c.Stall, c.Bucket)})
			}
		}
	}
	if c.Stall != nil && e.tr != nil {
		e.exportStall(k, c)
	}
}

func stallArgs(s *telemetry.Stall, bucket uint32) map[string]any {
	return map[string]any{"straggler": s.Straggler, "bucket": bucket, "late_ms": ms(s.Late), "waiters": s.Waiters,
		"waited_gpu_s": s.Waited.Seconds(), "threshold_ms": ms(s.Threshold), "median_ms": ms(s.Median)}
}

// exportStall exports the span "stall" of c on the straggler's resource:
// from when the last of the other ranks arrived to when the straggler
// did, the time the others spent waiting for it.
func (e *Exporter) exportStall(k stepKey, c telemetry.Collective) {
	s := c.Stall
	at := stragglerArrival(c)
	w := e.worker(s.Straggler)
	attrs := append(append(workerAttrs(w), stallAttrs(s)...), e.causeAttrs(s)...)
	attrs = append(attrs,
		attribute.Int("ddp.bucket", int(c.Bucket)),
		attribute.Int64("ddp.step", int64(c.Step)),
		attribute.Int64("ddp.generation", int64(c.Gen)))
	span := e.start(e.rankTracer(w), k, fmt.Sprintf("stall bucket %d", c.Bucket), true, "stall", at.Add(-s.Late), attrs...)
	span.End(trace.WithTimestamp(at))
}

// exportHang exports the span "hang" of hang h on the agent's resource,
// from its first arrival to now, with status Error.
func (e *Exporter) exportHang(k stepKey, h telemetry.Hang, stacks map[int]string, now time.Time) {
	name := "hang: bucket " + strconv.FormatUint(uint64(h.Bucket), 10)
	if len(h.Missing) > 0 {
		name = "hang: " + rankList(h.Missing) + " missing"
	}
	ranks := slices.Sorted(maps.Keys(stacks))
	if e.tr != nil {
		var hosts []string
		for _, r := range h.Missing {
			if w := e.worker(r); w.Host != "" && !slices.Contains(hosts, w.Host) {
				hosts = append(hosts, w.Host)
			}
		}
		span := e.start(e.tr.agentT, k, fmt.Sprintf("hang bucket %d", h.Bucket), true, "hang", h.Since, e.withRun(
			attribute.Int("ddp.bucket", int(h.Bucket)),
			attribute.Int64("ddp.step", int64(h.Step)),
			attribute.Int64("ddp.generation", int64(h.Gen)),
			attribute.IntSlice("ddp.missing_ranks", h.Missing),
			attribute.IntSlice("ddp.waiting_ranks", h.Waiting),
			attribute.StringSlice("ddp.missing_hosts", hosts))...)
		span.SetStatus(codes.Error, fmt.Sprintf("%s not finished after %v", h.Key, now.Sub(h.Since).Round(time.Millisecond)))
		for _, r := range ranks {
			attrs := append(workerAttrs(e.worker(r)),
				attribute.Bool("ddp.missing", slices.Contains(h.Missing, r)),
				attribute.String("code.stacktrace", truncate(stacks[r], maxStack)))
			span.AddEvent("python stack", trace.WithTimestamp(now), trace.WithAttributes(attrs...))
		}
		span.End(trace.WithTimestamp(now))
	}
	if e.file != nil {
		e.file.use(k.gen)
		st := map[string]string{}
		for _, r := range ranks {
			st[strconv.Itoa(r)] = truncate(stacks[r], maxStack)
		}
		e.file.add(event{Name: name, Cat: "hang", Ph: "i", Scope: "g", TS: micros(now), PID: jobPID, TID: 0,
			Args: map[string]any{"generation": h.Gen, "step": h.Step, "bucket": h.Bucket, "since_us": micros(h.Since),
				"missing": orEmpty(h.Missing), "waiting": orEmpty(h.Waiting), "stacks": st}})
	}
}

// exportFault exports a fault of generation gen as a span of its own
// trace on the agent's resource, with an event: "restart" when the job
// restarts, "job failed" when it ended there.
func (e *Exporter) exportFault(gen uint64, reason string, restarting bool, now time.Time) {
	name, key := "restart", "ddp.restart.reason"
	if !restarting {
		name, key = "job failed", "ddp.failure.reason"
	}
	if e.tr != nil {
		h := sha256.New()
		h.Write([]byte(e.traceJob()))
		var b [9]byte
		b[0] = kindRestart
		binary.BigEndian.PutUint64(b[1:], gen)
		h.Write(b[:])
		sum := h.Sum(nil)
		tid := trace.TraceID(sum[:16])
		ctx := withIDs(e.ctx, tid, spanID(tid, name))
		attrs := e.withRun(attribute.Int64("ddp.generation", int64(gen)), attribute.String(key, reason))
		_, span := e.tr.agentT.Start(ctx, name, trace.WithNewRoot(),
			trace.WithTimestamp(now), trace.WithAttributes(attrs...))
		span.AddEvent(name, trace.WithTimestamp(now), trace.WithAttributes(attrs...))
		span.End(trace.WithTimestamp(now))
	}
	if e.file != nil && e.file.f != nil {
		cat := "restart"
		if !restarting {
			cat = "failure"
		}
		e.file.add(event{Name: name, Cat: cat, Ph: "i", Scope: "g", TS: micros(now), PID: jobPID, TID: 0,
			Args: map[string]any{"generation": gen, "reason": reason}})
	}
}

// rankList names ranks: "rank 3", "ranks 3, 5", at most 8 of them.
func rankList(ranks []int) string {
	const most = 8
	var b strings.Builder
	b.WriteString("rank")
	if len(ranks) > 1 {
		b.WriteString("s")
	}
	for i, r := range ranks {
		if i == most {
			fmt.Fprintf(&b, " and %d more", len(ranks)-most)
			break
		}
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(" " + strconv.Itoa(r))
	}
	return b.String()
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "\n… (truncated)"
}

func orEmpty(s []int) []int {
	if s == nil {
		return []int{}
	}
	return s
}

// dtypeName names an ncclDataType_t.
func dtypeName(dt uint8) string {
	names := [...]string{"int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64", "bfloat16", "float8e4m3", "float8e5m2"}
	if int(dt) < len(names) {
		return names[dt]
	}
	return "dtype " + strconv.Itoa(int(dt))
}

// statusName names a status code of the shim (ddpshim.h).
func statusName(s uint8) string {
	names := [...]string{"ok", "invalid", "closed", "aborted", "timeout", "peer", "mismatch", "unavailable", "internal"}
	if int(s) < len(names) {
		return names[s]
	}
	return "status " + strconv.Itoa(int(s))
}

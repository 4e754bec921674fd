package export

import (
	"context"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// instruments are the exporter's metrics. Their attributes stay few: the
// bucket, the status, the straggler's rank.
type instruments struct {
	duration    metric.Float64Histogram // ddp.allreduce.duration, s, by bucket
	busbw       metric.Float64Histogram // ddp.allreduce.busbw, bytes/s, by bucket
	collectives metric.Int64Counter     // ddp.collectives, by status
	stalls      metric.Int64Counter     // ddp.stalls, by straggler rank
	waited      metric.Float64Counter   // ddp.stall.waited, GPU-seconds
	hangs       metric.Int64Counter     // ddp.hangs
	restarts    metric.Int64Counter     // ddp.restarts
	reforms     metric.Int64Counter     // ddp.reforms
	reformTime  metric.Float64Histogram // ddp.reform.duration, s
	stragglers  metric.Int64Gauge       // ddp.stragglers, by rank and cause
	steps       metric.Int64Counter     // ddp.steps
}

func newInstruments(m metric.Meter) (instruments, error) {
	var in instruments
	var errs [11]error
	in.duration, errs[0] = m.Float64Histogram("ddp.allreduce.duration", metric.WithUnit("s"),
		metric.WithDescription("Time of a gradient all-reduce: the longest any rank spent in it, the early ranks waiting inside."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	// In bytes per second, a base unit: Prometheus names it
	// ddp_allreduce_busbw_bytes_per_second, where "GBy/s" made a unit
	// promtool check metrics rejects. The buckets span 100 MB/s to 800 GB/s.
	in.busbw, errs[1] = m.Float64Histogram("ddp.allreduce.busbw", metric.WithUnit("By/s"),
		metric.WithDescription("Bus bandwidth of a gradient all-reduce as nccl-tests computes it, from the fastest rank's time."),
		metric.WithExplicitBucketBoundaries(1e8, 2.5e8, 5e8, 1e9, 2.5e9, 5e9, 1e10, 2.5e10, 5e10, 1e11, 2e11, 4e11, 8e11))
	in.collectives, errs[2] = m.Int64Counter("ddp.collectives", metric.WithUnit("{collective}"),
		metric.WithDescription("Gradient all-reduces finished on every rank."))
	in.stalls, errs[3] = m.Int64Counter("ddp.stalls", metric.WithUnit("{stall}"),
		metric.WithDescription("All-reduces slower than the stall threshold, by the rank that arrived last."))
	in.waited, errs[4] = m.Float64Counter("ddp.stall.waited", metric.WithUnit("s"),
		metric.WithDescription("Time the other ranks (their GPUs, on GPU jobs) spent waiting for stragglers, summed over the ranks."))
	in.hangs, errs[5] = m.Int64Counter("ddp.hangs", metric.WithUnit("{hang}"),
		metric.WithDescription("Collectives not finished by the hang timeout."))
	in.restarts, errs[6] = m.Int64Counter("ddp.restarts", metric.WithUnit("{restart}"),
		metric.WithDescription("Restarts of the worker group."))
	in.stragglers, errs[7] = m.Int64Gauge("ddp.stragglers", metric.WithUnit("{rank}"),
		metric.WithDescription("1 while the rank is named a persistent straggler, with its cause (input, compute, gpu, host, network, unknown); 0 after."))
	in.reforms, errs[8] = m.Int64Counter("ddp.reforms", metric.WithUnit("{reform}"),
		metric.WithDescription("In-process re-formations of the job's ranks (ddp_agent.InProcess): a fault recovered without restarting the workers."))
	in.reformTime, errs[9] = m.Float64Histogram("ddp.reform.duration", metric.WithUnit("s"),
		metric.WithDescription("Time from a fault to the completion of the step the ranks resumed at, in an in-process re-formation."),
		metric.WithExplicitBucketBoundaries(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60))
	in.steps, errs[10] = m.Int64Counter("ddp.steps", metric.WithUnit("{step}"),
		metric.WithDescription("Training steps whose gradients every rank all-reduced, counted at a step's first all-reduce; steps done again after a restart count again."))
	for _, err := range errs {
		if err != nil {
			return instruments{}, fmt.Errorf("metric instruments: %w", err)
		}
	}
	return in, nil
}

// maxZeroRanks bounds the stall series made at 0 ahead of a stall: one per
// rank up to it, so a huge job does not start with that many series.
const maxZeroRanks = 4096

// zero makes the event counters and the steps exist at 0 from the start:
// a counter that appears with its first increment has no earlier sample,
// so Prometheus's increase() and rate() miss that first stall, hang or
// restart, the one an alert is for. Not stalls: each rank's series starts
// at 0 with the first collective (measure), before any stall can be, and
// a series without a rank beside them made an empty group in a sum by
// ddp_straggler_rank.
func (in instruments) zero(ctx context.Context) {
	in.steps.Add(ctx, 0)
	in.waited.Add(ctx, 0)
	in.hangs.Add(ctx, 0)
	in.restarts.Add(ctx, 0)
	in.reforms.Add(ctx, 0)
}

// measure records c.
func (e *Exporter) measure(c telemetry.Collective) {
	bucket := metric.WithAttributeSet(attribute.NewSet(attribute.Int("ddp.bucket", int(c.Bucket))))
	e.inst.duration.Record(e.ctx, c.Duration().Seconds(), bucket)
	if bw := bandwidthOf(c); bw.busbw > 0 {
		e.inst.busbw.Record(e.ctx, bw.busbw, bucket)
	}
	var status uint8
	for _, r := range c.Records {
		if r.Status != 0 {
			status = r.Status
			break
		}
	}
	e.inst.collectives.Add(e.ctx, 1, metric.WithAttributes(attribute.String("ddp.status", statusName(status))))
	if k := (stepKey{c.Gen, c.Step}); newStep(e.lastStep, k, c.Bucket) {
		e.inst.steps.Add(e.ctx, 1)
		e.lastStep = &k
	}
	// Every rank's stall series exists at 0 once the world is known, so an
	// alert on increase(ddp_stalls_total) sees each rank's first stall
	// too; beyond maxZeroRanks the series appear with their first stall.
	for ; e.stallRanks < min(len(c.Records), maxZeroRanks); e.stallRanks++ {
		e.inst.stalls.Add(e.ctx, 0, metric.WithAttributes(attribute.Int("ddp.straggler.rank", e.stallRanks)))
	}
	if c.Stall != nil {
		e.inst.stalls.Add(e.ctx, 1, metric.WithAttributes(attribute.Int("ddp.straggler.rank", c.Stall.Straggler)))
		e.inst.waited.Add(e.ctx, c.Stall.Waited.Seconds())
	}
}

// newStep reports whether a collective of step k and bucket starts a step
// that ddp_steps_total has not counted, last being the newest it counted
// (nil: none yet): pure. A step's collectives come in order, a newer step's
// after an older one's (DDP's buckets of a step all finish before the
// optimizer's step, the next forward after it), and a new generation's
// steps are newer whatever their numbers (the hook counts from 0 again in
// new processes). Only gradient buckets count: ddp_agent's own collectives
// under InProcess are no training step, and their step labels run ahead
// or behind (the state move carries the step before the one resumed, and
// a script's all-reduce after the backward the next step's number).
func newStep(last *stepKey, k stepKey, bucket uint32) bool {
	return telemetry.Gradient(bucket) && (last == nil || k.compare(*last) > 0)
}

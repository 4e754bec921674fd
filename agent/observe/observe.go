// Package observe is what both modes do to observe a job on this node:
// the collective watch, its exporter (traces, metrics, Perfetto files),
// the host monitor of the job's workers, the notices of persistent
// stragglers, and the node's GPU health watch. ddp-agent run observes its
// one job, the sidecar each job of its user; each passes in its Policy,
// what it does about what is seen: restart the workers (a fault of the
// agent's run), or abort a job's communicators (the sidecar's). Its
// options are one Config block, with one flag helper (flags.go).
package observe

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// Config is what is watched in the workers' collectives and where it is
// exported: the one telemetry block of both modes' configurations.
type Config struct {
	HangTimeout  time.Duration // a collective unfinished this long after the first rank arrived is a hang; 0: none
	HangAuto     bool          // the timeout grows to 10 × the median step time
	OTelEndpoint string        // OTLP collector; "" leaves it to the OTEL_* variables
	OTLPProtocol string        // export.ProtocolGRPC or ProtocolHTTP; "" leaves it to the OTEL_* variables
	TraceSample  float64       // share of normal steps traced; stalled steps always are
	MetricsAddr  string        // Prometheus endpoint; "" none
	// StragglerCost: the share of step time a persistent straggler's waits
	// must cost before it is named; 0: stall.DefaultCost.
	StragglerCost float64
	// MetricsLinger: at the job's end, the metrics endpoint stays up until
	// a scraper that read it before reads the last state, at most this
	// long (not after a signal); 0 closes it at once.
	MetricsLinger time.Duration
	// Console gets a hang's Python stacks as they are, readable, after
	// the log's one-line record: the agent's stderr when that is a
	// terminal (Terminal); nil keeps them in the record, escaped.
	Console io.Writer
	// Version is the agent's release, the resource's service.version; ""
	// leaves it out.
	Version string
}

// Terminal returns f when it is a terminal, else nil: Config.Console for
// an agent logging to f.
func Terminal(f *os.File) io.Writer {
	if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
		return f
	}
	return nil
}

// Job is one job observed on this node.
type Job struct {
	ID       string
	NodeRank int
	Topology string // the node's GPUs in one line, for the exporter's resource; "" none
	TraceDir string // where its Perfetto files and hang reports go (a directory kept after the job); "" none
	// Metrics: this job serves Config.MetricsAddr (one address serves one
	// job's exporter).
	Metrics bool
	// Hub, when set, serves this job's metrics beside other jobs' (the
	// sidecar's one address), in place of Metrics.
	Hub    *export.Hub
	Health export.Health // the probes next to /metrics; nil none
	Log    *slog.Logger
}

// Policy is what the mode does about what the observer sees. The watch
// calls them from its goroutines, under its lock: they must not block.
type Policy struct {
	// RankOf names the rank of a worker's pid, for its stack; an error
	// for a process that is not a worker of the job.
	RankOf func(pid int) (int, error)
	// ReadGPU reads a GPU's state for a straggler's evidence (ReadGPU);
	// nil none.
	ReadGPU func(uuid string) (watch.GPUReading, error)
	// OnHang is told a hang of this node's analysis; OnRemoteHang one
	// the job's leader found (nil: ignored).
	OnHang       func(*watch.HangError)
	OnRemoteHang func(telemetry.Hang)
	// OnStragglers is handed the persistent stragglers named at each look,
	// after the notices; nil none.
	OnStragglers func([]telemetry.Straggler)
	// Notify tells the notifier plugins a notice (a rank newly named a
	// persistent straggler); nil: no notifiers.
	Notify func(notifier.Event)
}

// Observer observes one job: its watch, its exporter and the host
// monitor of its workers. Open makes it; Run runs the watch and the
// monitor; Close flushes and closes.
type Observer struct {
	Watch   *watch.Watch
	Exp     *export.Exporter
	Mon     *hostmon.Monitor
	log     *slog.Logger
	linger  time.Duration              // Config.MetricsLinger
	named   pluginhost.NamedStragglers // the stragglers the notifiers were told of
	notify  func(notifier.Event)       // Policy.Notify
	reforms reforms                    // the in-process re-formations told
}

// Open starts observing job: the watch, with policy's hands, and its
// exporter, as cfg and the OTEL_* variables say. ctx is the exporter's
// (the job's life on this node).
func Open(ctx context.Context, cfg Config, job Job, policy Policy) (*Observer, error) {
	o := &Observer{Mon: hostmon.NewMonitor(job.Log), log: job.Log, linger: cfg.MetricsLinger, notify: policy.Notify}
	onStragglers := func(named []telemetry.Straggler) {
		o.notice(named, policy.Notify)
		if policy.OnStragglers != nil {
			policy.OnStragglers(named)
		}
	}
	o.Watch = watch.New(watch.Config{Log: job.Log, HangTimeout: cfg.HangTimeout, HangAuto: cfg.HangAuto,
		StragglerCost: cfg.StragglerCost, RankOf: policy.RankOf, ReadGPU: policy.ReadGPU, ReadHost: o.Mon.Slowdown,
		OnStragglers: onStragglers, OnHang: policy.OnHang, OnRemoteHang: policy.OnRemoteHang,
		Console: cfg.Console, ReportDir: job.TraceDir})
	host, _ := os.Hostname()
	metrics := ""
	if job.Metrics {
		metrics = cfg.MetricsAddr
	}
	exp, err := export.New(ctx, export.Config{JobID: job.ID, NodeRank: job.NodeRank, Host: host, Topology: job.Topology, Version: cfg.Version,
		Endpoint: cfg.OTelEndpoint, Protocol: cfg.OTLPProtocol, SampleRatio: cfg.TraceSample, TraceDir: job.TraceDir,
		MetricsAddr: metrics, Health: job.Health, Hub: job.Hub, Worker: o.Watch.Worker, Logger: job.Log})
	if err != nil {
		o.Watch.Close()
		return nil, fmt.Errorf("telemetry: %w", err)
	}
	o.Exp = exp
	o.Watch.SetExporter(exp)
	return o, nil
}

// Run runs the watch and the host monitor until ctx is done.
func (o *Observer) Run(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = o.Mon.Run(ctx)
	}()
	o.Watch.Run(ctx)
	<-done
	return nil
}

// Close flushes the exporter (bounded: a collector that is gone costs 5
// s at most; the Perfetto file is complete after it) and closes the
// watch. ctx's values are kept, not its end.
func (o *Observer) Close(ctx context.Context) {
	if ctx.Err() == nil && o.linger > 0 && o.Exp.Scraped() {
		o.log.Info("waiting for a scraper to read the job's last metrics", "url", o.Exp.MetricsURL(), "at_most", o.linger)
		start := time.Now()
		read := o.Exp.Linger(ctx, o.linger)
		o.log.Info("metrics endpoint closing", "last_state_read", read, "waited", time.Since(start).Round(time.Millisecond))
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := o.Exp.Shutdown(sctx); err != nil {
		o.log.Warn("telemetry shutdown", "err", err)
	}
	o.Watch.Close()
}

// notice tells notify about each rank newly named a persistent
// straggler (the watch hands over the named ranks at every look).
func (o *Observer) notice(named []telemetry.Straggler, notify func(notifier.Event)) {
	if notify == nil {
		return
	}
	for _, st := range o.named.Fresh(named) {
		msg, details := pluginhost.StragglerNotice(st)
		notify(notifier.Event{Kind: notifier.Straggler, Rank: st.Rank, Message: msg, Details: details})
	}
}

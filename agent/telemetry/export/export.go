// Package export turns the collectives, stalls and hangs of package
// telemetry into OpenTelemetry traces and metrics, sent over OTLP (gRPC or
// HTTP); a Prometheus endpoint with the same metrics; and, without OTLP, a
// Perfetto (Chrome trace event JSON) file per generation.
//
// Every step of every generation is one trace whose id derives from (job,
// run, generation, step) (TraceID, TraceJob), and every span id derives
// from the trace id and what the span is, so the spans of all ranks meet in
// one trace and an export repeated by another agent or after a restart
// gives the same ids.
//
// The collectives of a step arrive over time, bucket by bucket. The
// exporter holds a step until a collective of a later step (or
// generation) arrives, or until Config.StepDelay has passed since its
// latest collective, or until Hang, Generation or Shutdown; then it decides
// whether to keep the step (every step with a stall is kept, the others by
// Config.SampleRatio) and exports the root span "step", covering the
// step's collectives, with its children: an "allreduce" span per rank and
// collective, and a "stall" span per stall. Span names are bounded (the
// step, rank and bucket are attributes), and the spans of each rank come
// from a resource of their own (service.name "ddp-agent rank R", see
// tracers), so a trace viewer shows the rank on every row. A collective that arrives after
// its step went out is exported on its own under the same root span id.
// Metrics are recorded at once, for every collective.
package export

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/ddp-agent/ddp-agent/agent/telemetry"
)

// Config says what to export and where.
type Config struct {
	JobID    string
	NodeRank int
	Host     string
	Topology string // a one-line GPU topology summary; "" on a CPU node
	Version  string // the agent's release: service.version; "" leaves it out

	// Endpoint is the OTLP collector (--otel-endpoint): host:port
	// (plaintext), or an http:// or https:// URL (for http/protobuf the
	// base that /v1/traces and /v1/metrics are appended to). "" leaves it
	// to OTEL_EXPORTER_OTLP_ENDPOINT and the per-signal
	// OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT, which the OTel
	// exporters read themselves together with the other OTEL_EXPORTER_OTLP_*
	// variables; with no endpoint anywhere (or OTEL_SDK_DISABLED=true)
	// there is no OTLP.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTP; "" takes
	// OTEL_EXPORTER_OTLP_{TRACES,METRICS}_PROTOCOL or
	// OTEL_EXPORTER_OTLP_PROTOCOL, and grpc without them.
	Protocol string

	// SampleRatio is the share of steps without a stall whose spans (and
	// trace-file events) are kept: 0 keeps none, 1 all; steps with a stall
	// and hangs are always kept. The choice depends on the trace id alone,
	// so every agent and every re-export makes the same. Metrics count
	// every step.
	SampleRatio float64
	// StepDelay is how long a step is held for more of its collectives
	// after its latest one arrived, when no later step comes; 0 means 2 s.
	StepDelay time.Duration

	// TraceDir, when there is no OTLP for traces, receives
	// trace-gen<N>.json per generation; "" writes none.
	TraceDir string
	// MetricsAddr is where Prometheus scrapes /metrics (":9464"), and
	// where the probes GET /healthz and /readyz are answered (see Health);
	// "" serves none.
	MetricsAddr string
	// Health answers /healthz and /readyz; nil serves /healthz alone,
	// answering ok while the process serves HTTP.
	Health Health
	// Hub, when set (and MetricsAddr is not), serves this exporter's
	// metrics beside other jobs' on its one address, until Shutdown.
	Hub *Hub

	// Worker says where a rank runs, for span attributes; nil knows
	// nothing. It is called with the exporter's lock held: it must not
	// call the Exporter.
	Worker func(rank int) telemetry.Worker
	Logger *slog.Logger

	exportTimeout time.Duration // of one OTLP export, retries included; 0 means 10 s
}

// Exporter exports telemetry as Config says. Its methods are safe for
// concurrent use and do not block on the network: OTLP exports run in the
// background, in batches. After Shutdown they do nothing.
type Exporter struct {
	cfg Config
	log *slog.Logger
	ctx context.Context // for its values only: spans and measurements

	tr    *tracers      // nil without OTLP traces
	fails []*failureLog // of the OTLP exports, one per signal
	mp    *sdkmetric.MeterProvider
	inst  instruments

	srv        *http.Server // nil without MetricsAddr
	scrapes    *scrapes     // the reads of srv's /metrics
	srvDone    chan struct{}
	unhub      func() // stops the Hub serving this exporter's metrics; nil without one
	metricsURL string

	run atomic.Pointer[string] // SetRun's; nil before

	mu         sync.Mutex
	closed     bool
	file       *traceFile // nil without a trace file
	pending    map[stepKey]*pendingStep
	done       map[stepKey]stepState // the steps exported lately
	order      []stepKey             // of done, oldest first
	timer      *time.Timer
	named      map[int]telemetry.Cause // the persistent stragglers named at the last look
	stallRanks int                     // ranks 0..stallRanks-1 have a ddp_stalls_total series
	lastStep   *stepKey                // the newest step counted in ddp_steps_total; nil before the first
}

// stepKey is one step of one generation: one trace.
type stepKey struct{ gen, step uint64 }

func (k stepKey) compare(o stepKey) int {
	return cmp.Or(cmp.Compare(k.gen, o.gen), cmp.Compare(k.step, o.step))
}

// pendingStep holds a step's collectives until it is exported.
type pendingStep struct {
	colls   []telemetry.Collective
	stalled bool
}

// stepState is what became of an exported step.
type stepState struct {
	kept bool // its spans were exported
	root bool // its root span was exported
}

// remembered is how many exported steps are remembered, for collectives
// that arrive late.
const remembered = 256

// New sets up the exports cfg asks for: the OTLP exporters (which connect
// lazily), the trace dir, and the Prometheus listener, whose address is
// taken at once. ctx is used while setting up, and for its values after.
func New(ctx context.Context, cfg Config) (*Exporter, error) {
	if cfg.StepDelay <= 0 {
		cfg.StepDelay = 2 * time.Second
	}
	if cfg.exportTimeout <= 0 {
		cfg.exportTimeout = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	e := &Exporter{
		cfg:     cfg,
		log:     cfg.Logger,
		ctx:     context.WithoutCancel(ctx),
		pending: map[stepKey]*pendingStep{},
		done:    map[stepKey]stepState{},
	}
	traceEP, traceOTLP, err := otlpEndpoint(cfg.Endpoint, cfg.Protocol, "traces")
	if err != nil {
		return nil, err
	}
	metricEP, metricOTLP, err := otlpEndpoint(cfg.Endpoint, cfg.Protocol, "metrics")
	if err != nil {
		return nil, err
	}
	res, err := e.resource(ctx)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			e.shutdownProviders(ctx)
		}
	}()

	if traceOTLP {
		fail := e.failureLog("traces", traceEP)
		exp, err := newSpanExporter(ctx, traceEP, cfg.exportTimeout, fail)
		if err != nil {
			return nil, fmt.Errorf("otlp trace exporter for %s: %w", traceEP, err)
		}
		logged := loggedSpans{exp, fail}
		bsp := sdktrace.NewBatchSpanProcessor(logged,
			sdktrace.WithBatchTimeout(time.Second),
			sdktrace.WithExportTimeout(cfg.exportTimeout),
			sdktrace.WithMaxQueueSize(1<<15))
		e.tr = newTracers(res, cfg.JobID, bsp)
		e.log.Info("exporting traces over otlp", "endpoint", traceEP.String(), "service", e.tr.service, "sample", cfg.SampleRatio)
	} else if cfg.TraceDir != "" {
		if e.file, err = newTraceFile(cfg.TraceDir, cfg.JobID, e.log); err != nil {
			return nil, err
		}
		e.log.Info("writing perfetto trace files", "dir", cfg.TraceDir, "sample", cfg.SampleRatio)
	}

	mopts := []sdkmetric.Option{sdkmetric.WithResource(res)}
	if metricOTLP {
		fail := e.failureLog("metrics", metricEP)
		exp, err := newMetricExporter(ctx, metricEP, cfg.exportTimeout, fail)
		if err != nil {
			return nil, fmt.Errorf("otlp metric exporter for %s: %w", metricEP, err)
		}
		logged := loggedMetrics{exp, fail}
		mopts = append(mopts, sdkmetric.WithReader(sdkmetric.NewPeriodicReader(logged, sdkmetric.WithTimeout(cfg.exportTimeout))))
	}
	var reg *prometheus.Registry
	if cfg.MetricsAddr != "" || cfg.Hub != nil {
		reg = prometheus.NewRegistry()
		// The job id labels every series, so that jobs sharing a
		// Prometheus tell apart without a join on target_info.
		pexp, err := otelprom.New(otelprom.WithRegisterer(reg), otelprom.WithoutScopeInfo(),
			otelprom.WithResourceAsConstantLabels(func(kv attribute.KeyValue) bool { return kv.Key == "ddp.job_id" }))
		if err != nil {
			return nil, fmt.Errorf("prometheus exporter: %w", err)
		}
		mopts = append(mopts, sdkmetric.WithReader(pexp))
	}
	e.mp = sdkmetric.NewMeterProvider(mopts...)
	if e.inst, err = newInstruments(e.mp.Meter(scope)); err != nil {
		return nil, err
	}
	e.inst.zero(e.ctx)
	switch {
	case reg != nil && cfg.MetricsAddr != "":
		if err := e.serveMetrics(reg); err != nil {
			return nil, err
		}
	case reg != nil:
		e.unhub = cfg.Hub.add(reg)
		e.metricsURL = cfg.Hub.URL()
	}
	ok = true
	return e, nil
}

func (e *Exporter) resource(ctx context.Context) (*resource.Resource, error) {
	attrs := []attribute.KeyValue{
		attribute.String("service.name", "ddp-agent"),
		attribute.String("ddp.job_id", e.cfg.JobID),
		attribute.Int("ddp.node_rank", e.cfg.NodeRank),
		attribute.String("host.name", e.cfg.Host),
	}
	if e.cfg.Topology != "" {
		attrs = append(attrs, attribute.String("ddp.topology", e.cfg.Topology))
	}
	if e.cfg.Version != "" {
		attrs = append(attrs, attribute.String("service.version", e.cfg.Version))
	}
	// OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME come last: what the
	// user sets wins.
	res, err := resource.New(ctx, resource.WithTelemetrySDK(), resource.WithAttributes(attrs...), resource.WithFromEnv())
	if err != nil {
		if res == nil || !errors.Is(err, resource.ErrPartialResource) {
			return nil, fmt.Errorf("otel resource: %w", err)
		}
		e.log.Warn("otel resource: some attributes left out", "err", err)
	}
	return res, nil
}

// serveMetrics listens on MetricsAddr and serves reg on /metrics.
func (e *Exporter) serveMetrics(reg *prometheus.Registry) error {
	ln, err := net.Listen("tcp", e.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("prometheus listener: %w", err)
	}
	mux := http.NewServeMux()
	e.scrapes = newScrapes()
	mux.Handle("/metrics", e.scrapes.wrap(promhttp.HandlerFor(reg, promhttp.HandlerOpts{})))
	healthHandlers(mux, e.cfg.Health)
	e.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	e.srvDone = make(chan struct{})
	addr := ln.Addr().(*net.TCPAddr)
	e.metricsURL = "http://" + net.JoinHostPort(urlHost(addr), strconv.Itoa(addr.Port)) + "/metrics"
	go func() {
		defer close(e.srvDone)
		if err := e.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.log.Warn("prometheus endpoint stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	e.log.Info("serving prometheus metrics", "url", e.metricsURL)
	return nil
}

// Linger keeps the metrics endpoint up, at most max, until a scrape begun
// after the call has read the job's last state; at once when nothing
// serves metrics or nothing ever scraped them (no scraper is coming). It
// reports whether a scraper read the last state.
func (e *Exporter) Linger(ctx context.Context, max time.Duration) bool {
	if e.scrapes == nil || max <= 0 {
		return false
	}
	return e.scrapes.waitNext(ctx, max)
}

// Scraped reports whether anything read the metrics endpoint yet.
func (e *Exporter) Scraped() bool { return e.scrapes != nil && e.scrapes.any() }

// MetricsURL is where Prometheus can scrape the metrics ("" without
// MetricsAddr); a listener on all addresses is named by 127.0.0.1.
func (e *Exporter) MetricsURL() string { return e.metricsURL }

// tracing reports whether spans go anywhere.
func (e *Exporter) tracing() bool { return e.tr != nil || e.file != nil }

// Collectives exports finished collectives: metrics for every one at once,
// spans and trace-file events when their step is exported (see the
// package comment).
func (e *Exporter) Collectives(cs []telemetry.Collective) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	for _, c := range cs {
		e.measure(c)
		if !e.tracing() {
			continue
		}
		k := stepKey{c.Gen, c.Step}
		e.flushPending(func(p stepKey) bool { return p.compare(k) < 0 }, stepKey{}, false)
		if st, ok := e.done[k]; ok {
			e.late(k, st, c)
			continue
		}
		p := e.pending[k]
		if p == nil {
			p = &pendingStep{}
			e.pending[k] = p
		}
		p.colls = append(p.colls, c)
		p.stalled = p.stalled || c.Stall != nil
	}
	if len(e.pending) > 0 {
		if e.timer == nil {
			e.timer = time.AfterFunc(e.cfg.StepDelay, e.onTimer)
		} else {
			e.timer.Reset(e.cfg.StepDelay)
		}
	}
	e.flushFile()
}

func (e *Exporter) onTimer() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.flushPending(func(stepKey) bool { return true }, stepKey{}, false)
	e.flushFile()
}

// flushPending exports the pending steps that match, oldest first; step
// keep (when forced) is kept whatever the sampling says.
func (e *Exporter) flushPending(match func(stepKey) bool, keep stepKey, forced bool) {
	var ks []stepKey
	for k := range e.pending {
		if match(k) {
			ks = append(ks, k)
		}
	}
	slices.SortFunc(ks, stepKey.compare)
	for _, k := range ks {
		p := e.pending[k]
		delete(e.pending, k)
		kept := p.stalled || (forced && k == keep) || sampled(e.traceID(k), e.cfg.SampleRatio)
		e.remember(k, stepState{kept: kept, root: kept})
		if kept {
			e.exportStep(k, p.colls)
		}
	}
}

// remember notes what became of step k.
func (e *Exporter) remember(k stepKey, st stepState) {
	if _, ok := e.done[k]; !ok {
		e.order = append(e.order, k)
		if len(e.order) > remembered {
			delete(e.done, e.order[0])
			e.order = e.order[1:]
		}
	}
	e.done[k] = st
}

// late exports c, whose step was exported already: under the step's root
// when the step was kept, or when c itself stalled.
func (e *Exporter) late(k stepKey, st stepState, c telemetry.Collective) {
	if !st.kept && c.Stall == nil {
		return
	}
	if !st.root {
		e.exportStep(k, []telemetry.Collective{c})
		e.remember(k, stepState{kept: true, root: true})
		return
	}
	e.exportCollective(k, c)
}

// Hang exports a hang: always, whatever the sampling. The hang's step is
// exported at once with what it has, and gets a span "hang: …" naming
// the missing ranks, with an event carrying the Python stack of each rank
// in stacks (rank → stack).
func (e *Exporter) Hang(h telemetry.Hang, stacks map[int]string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.inst.hangs.Add(e.ctx, 1)
	if !e.tracing() {
		return
	}
	k := stepKey{h.Gen, h.Step}
	e.flushPending(func(p stepKey) bool { return p.compare(k) <= 0 }, k, true)
	now := time.Now()
	if st := e.done[k]; !st.root {
		e.exportRoot(k, h.Since, now, nil)
		e.remember(k, stepState{kept: true, root: true})
	}
	e.exportHang(k, h, stacks, now)
	e.flushFile()
}

// Fault exports a fault of generation gen that stopped the job's
// workers, saying why: a "restart" span and instant when the job restarts
// (counted in ddp_restarts_total), a "job failed" one when the fault ended
// it here (no restarts left), which no restart counter counts.
func (e *Exporter) Fault(gen uint64, reason string, restarting bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	if restarting {
		e.inst.restarts.Add(e.ctx, 1)
	}
	e.exportFault(gen, reason, restarting, time.Now())
	e.flushFile()
}

// Generation says that generation gen starts: pending steps are exported
// and the trace file of gen begins.
func (e *Exporter) Generation(gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed {
		return
	}
	e.flushPending(func(stepKey) bool { return true }, stepKey{}, false)
	if e.file != nil {
		e.file.use(gen)
	}
	e.flushFile()
}

// flushFile writes what the trace file has buffered.
func (e *Exporter) flushFile() {
	if e.file != nil {
		e.file.flush()
	}
}

// Shutdown exports the pending steps, closes the trace file (valid JSON
// from then on), flushes the OTLP exporters and stops the Prometheus
// endpoint. It returns by ctx's deadline, or after twice the export
// timeout when ctx has none, exports unfinished. Calls after the first
// return nil.
func (e *Exporter) Shutdown(ctx context.Context) error {
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		return nil
	}
	e.closed = true
	if e.timer != nil {
		e.timer.Stop()
	}
	e.flushPending(func(stepKey) bool { return true }, stepKey{}, false)
	var err error
	if e.file != nil {
		if ferr := e.file.close(); ferr != nil {
			err = fmt.Errorf("trace file: %w", ferr)
		}
	}
	e.mu.Unlock()

	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, 2*e.cfg.exportTimeout)
		defer cancel()
	}
	pctx := ctx
	failing := e.failing()
	if failing {
		// A collector that did not take the last export is not waited
		// for long at exit; it was warned about when it failed.
		var cancel context.CancelFunc
		pctx, cancel = context.WithTimeout(ctx, time.Second)
		defer cancel()
	}
	if perr := e.shutdownProviders(pctx); perr != nil && failing && errors.Is(perr, context.DeadlineExceeded) {
		e.log.Debug("otlp: what was left unexported at exit is dropped", "err", perr)
	} else {
		err = errors.Join(err, perr)
	}
	if e.unhub != nil {
		e.unhub()
	}
	if e.srv != nil {
		if serr := e.srv.Shutdown(ctx); serr != nil {
			e.srv.Close()
			err = errors.Join(err, fmt.Errorf("prometheus endpoint: %w", serr))
		}
		<-e.srvDone
	}
	return err
}

// failing reports whether the last OTLP export of some signal failed.
func (e *Exporter) failing() bool {
	for _, f := range e.fails {
		if f.isFailing() {
			return true
		}
	}
	return false
}

func (e *Exporter) shutdownProviders(ctx context.Context) error {
	var err error
	if e.tr != nil {
		if terr := e.tr.shutdown(ctx); terr != nil {
			err = fmt.Errorf("trace provider: %w", terr)
		}
	}
	if e.mp != nil {
		if merr := e.mp.Shutdown(ctx); merr != nil {
			err = errors.Join(err, fmt.Errorf("meter provider: %w", merr))
		}
	}
	return err
}

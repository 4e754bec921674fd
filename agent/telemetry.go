package agent

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// workers describes the attempt's workers by local rank.
func (r *run) workers(g *supervisor.Group, offset int) []telemetry.Worker {
	host, _ := os.Hostname()
	pids := g.PIDs()
	ws := make([]telemetry.Worker, r.cfg.NProcPerNode)
	for lr := range ws {
		ws[lr] = telemetry.Worker{Rank: offset + lr, LocalRank: lr, Host: host, PID: pids[offset+lr], GPUIndex: -1}
		if r.cfg.GPUs != nil && r.cfg.GPUs.Plan != nil && lr < len(r.cfg.GPUs.Plan.Workers) {
			if pw := r.cfg.GPUs.Plan.Workers[lr]; pw.UUID != "" {
				// The index in the workers' CUDA order: the ring position.
				ws[lr].GPU, ws[lr].GPUIndex = pw.UUID, lr
			}
		}
	}
	return ws
}

// openExporter starts the traces, metrics and Perfetto file of this run,
// as the configuration and the OTEL_* variables say; close flushes them
// (bounded). health answers the probes next to /metrics.
func (r *run) openExporter(ctx context.Context, runID, runDir string, keep bool, worker func(int) telemetry.Worker,
	health export.Health) (*export.Exporter, func(), error) {
	tc := r.cfg.Telemetry
	host, _ := os.Hostname()
	traceDir := ""
	if keep {
		traceDir = runDir
	}
	topo := ""
	if r.cfg.GPUs != nil && r.cfg.GPUs.Topology != nil {
		topo = r.cfg.GPUs.Topology.Summary()
	}
	exp, err := export.New(ctx, export.Config{
		JobID: runID, NodeRank: r.cfg.Rendezvous.NodeRank, Host: host, Topology: topo,
		Endpoint: tc.OTelEndpoint, Protocol: tc.OTLPProtocol, SampleRatio: tc.TraceSample, TraceDir: traceDir,
		MetricsAddr: tc.MetricsAddr, Health: health, Worker: worker, Logger: r.log,
	})
	if err != nil {
		return nil, func() {}, fmt.Errorf("telemetry: %w", err)
	}
	if u := exp.MetricsURL(); u != "" {
		r.log.Info("Prometheus metrics", "url", u)
	}
	return exp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := exp.Shutdown(sctx); err != nil {
			r.log.Warn("telemetry shutdown", "err", err)
		}
	}, nil
}

// newStragglerPolicy builds the policy of a run (--straggler-action): a
// restart or a drain it decides is a fault. The session's watch and store
// client are read when the policy acts, not now.
func (r *run) newStragglerPolicy(ctx context.Context) *straggler.Policy {
	tc := r.cfg.Telemetry
	cfg := straggler.Config{
		Log: r.log, Action: tc.StragglerAction, Confirm: tc.StragglerConfirm,
		MinNodes: r.cfg.Rendezvous.NNodesMin, MaxRestarts: r.cfg.MaxRestarts,
		Restart: func(gen uint64, seen time.Time, se *straggler.Error) { r.faults.report(stragglerFault(gen, seen, se)) },
		Drain: func(se *straggler.Error) {
			r.faults.report(stragglerFault(0, time.Now(), se))
		},
		Background: r.goBackground,
		Owner:      func(rank int) string { return r.watch.Worker(rank).Host },
	}
	if rz := r.cfg.Rendezvous; rz.Backend.UsesStore() {
		// Through the session's store client (which follows the store's
		// members and carries the job's certificates).
		cfg.JobStatus = func(ctx context.Context) (*rdzv.Status, error) {
			if r.j.cli == nil {
				return nil, errors.New("no rendezvous store to read the job from")
			}
			return rdzv.ReadStatus(ctx, r.j.cli, rz.Prefix, r.runID)
		}
	}
	return straggler.New(ctx, cfg)
}

// startTelemetry starts the collective watch and its exporter; the
// returned func flushes and closes them.
func (r *run) startTelemetry(ctx context.Context) (func(), error) {
	var readGPU func(string) (watch.GPUReading, error)
	if r.cfg.GPUs != nil && r.cfg.GPUs.State != nil {
		readGPU = func(uuid string) (watch.GPUReading, error) {
			st, err := r.cfg.GPUs.State(uuid)
			if err != nil {
				return watch.GPUReading{}, err
			}
			return watch.GPUReading{State: st.String(), Slowdown: st.Slowdown()}, nil
		}
	}
	r.watch = watch.New(watch.Config{Log: r.log, HangTimeout: r.cfg.Telemetry.HangTimeout, HangAuto: r.cfg.Telemetry.HangAuto,
		StragglerCost: r.cfg.Telemetry.StragglerCost, RankOf: r.authorize, ReadGPU: readGPU, ReadHost: r.mon.Slowdown,
		OnStragglers: func(named []telemetry.Straggler) { r.notifyStragglers(named); r.stragglers.Look(named) }, OnHang: func(h *watch.HangError) { r.faults.report(hangFault(h)) }})
	exp, closeExp, err := r.openExporter(ctx, r.runID, r.runDir, r.keep, r.watch.Worker, r.health)
	if err != nil {
		r.watch.Close()
		return nil, err
	}
	r.exp = exp
	r.watch.SetExporter(exp)
	if pub, ok := r.j.rz.(watch.Publisher); ok {
		r.goBackground(func() { r.watch.Publish(ctx, pub) })
	}
	r.goBackground(func() { r.watch.Run(ctx) })
	return func() {
		closeExp()
		r.watch.Close()
	}, nil
}

// startMonitors starts the host monitor and the GPU health watch, whose
// findings that call for a restart, a reset or a drain are faults.
func (r *run) startMonitors(ctx context.Context) {
	r.goBackground(func() { _ = r.mon.Run(ctx) })
	r.goBackground(func() { r.watchGPUs(ctx, r.faults.report) })
}

// eventTally counts the collective timing events that the workers' shims
// send over the control socket during one attempt. (Turning them into
// stall analysis and traces is the telemetry package's job.)
type eventTally struct {
	mu       sync.Mutex
	received uint64
	dropped  uint64
	failed   uint64 // events whose collective returned an error
	ranks    map[int]bool
}

func newEventTally() *eventTally { return &eventTally{ranks: map[int]bool{}} }

// add is the control server's OnEvents; it runs on connection goroutines.
func (t *eventTally) add(rank int, ev wire.Events) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.received += uint64(len(ev.Events))
	t.dropped += ev.Dropped
	for _, e := range ev.Events {
		if e.Failed() {
			t.failed++
		}
	}
	t.ranks[rank] = true
}

// report logs the attempt's counts, if any shim sent events, and resets
// them. It first waits (briefly) for the workers' control connections to
// close, so that the last batch, sent as a worker exits, is counted.
func (t *eventTally) report(log *slog.Logger, gen uint64, conns func() int) {
	for deadline := time.Now().Add(time.Second); conns() > 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	t.mu.Lock()
	received, dropped, failed, ranks := t.received, t.dropped, t.failed, len(t.ranks)
	t.received, t.dropped, t.failed, t.ranks = 0, 0, 0, map[int]bool{}
	t.mu.Unlock()
	if received == 0 && dropped == 0 {
		return
	}
	log.Info("collective events", "generation", gen, "received", received, "dropped", dropped, "failed", failed, "ranks", ranks)
}

// onEvents is the control socket's OnEvents: a worker's collective events,
// counted and watched.
func (r *run) onEvents(rank int, ev wire.Events) {
	r.events.add(rank, ev)
	r.watch.Add(rank, ev)
}

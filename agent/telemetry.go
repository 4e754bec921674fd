package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
)

// workers describes the attempt's workers by local rank.
func (a *Agent) workers(g *supervisor.Group, offset int) []telemetry.Worker {
	host, _ := os.Hostname()
	pids := g.PIDs()
	ws := make([]telemetry.Worker, a.cfg.NProcPerNode)
	for lr := range ws {
		ws[lr] = telemetry.Worker{Rank: offset + lr, LocalRank: lr, Host: host, PID: pids[offset+lr], GPUIndex: -1}
		if a.gpus != nil && a.gpus.Plan != nil && lr < len(a.gpus.Plan.Workers) {
			if pw := a.gpus.Plan.Workers[lr]; pw.UUID != "" {
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
func (a *Agent) openExporter(ctx context.Context, runID, runDir string, keep bool, worker func(int) telemetry.Worker,
	health export.Health) (*export.Exporter, func(), error) {
	tc := a.cfg.Telemetry
	host, _ := os.Hostname()
	traceDir := ""
	if keep {
		traceDir = runDir
	}
	topo := ""
	if a.gpus != nil && a.gpus.Topology != nil {
		topo = a.gpus.Topology.Summary()
	}
	exp, err := export.New(ctx, export.Config{
		JobID: runID, NodeRank: a.cfg.Rendezvous.NodeRank, Host: host, Topology: topo,
		Endpoint: tc.OTelEndpoint, Protocol: tc.OTLPProtocol, SampleRatio: tc.TraceSample, TraceDir: traceDir,
		MetricsAddr: tc.MetricsAddr, Health: health, Worker: worker, Logger: a.log,
	})
	if err != nil {
		return nil, func() {}, fmt.Errorf("telemetry: %w", err)
	}
	if u := exp.MetricsURL(); u != "" {
		a.log.Info("Prometheus metrics", "url", u)
	}
	return exp, func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := exp.Shutdown(sctx); err != nil {
			a.log.Warn("telemetry shutdown", "err", err)
		}
	}, nil
}

// newStragglerPolicy builds the policy of a run (--straggler-action): a
// restart or a drain it decides is a fault. The session's watch and store
// client are read when the policy acts, not now.
func (a *Agent) newStragglerPolicy(ctx context.Context, s *session) *straggler.Policy {
	tc := a.cfg.Telemetry
	cfg := straggler.Config{
		Log: a.log, Action: tc.StragglerAction, Confirm: tc.StragglerConfirm,
		MinNodes: a.cfg.Rendezvous.NNodesMin, MaxRestarts: a.cfg.MaxRestarts,
		Restart: func(gen uint64, seen time.Time, se *straggler.Error) { s.faults.report(stragglerFault(gen, seen, se)) },
		Drain: func(se *straggler.Error) {
			s.faults.report(stragglerFault(0, time.Now(), se))
		},
		Background: s.goBackground,
		Owner:      func(rank int) string { return s.watch.Worker(rank).Host },
	}
	if r := a.cfg.Rendezvous; r.Backend.UsesStore() {
		// Through the session's store client (which follows the store's
		// members and carries the job's certificates).
		cfg.JobStatus = func(ctx context.Context) (*rdzv.Status, error) {
			if s.j.cli == nil {
				return nil, errors.New("no rendezvous store to read the job from")
			}
			return rdzv.ReadStatus(ctx, s.j.cli, r.Prefix, s.runID)
		}
	}
	return straggler.New(ctx, cfg)
}

package agent

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/rdzv"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
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

// newStragglerPolicy builds the policy of a run (--straggler-action): a
// restart or a drain it decides is a fault. The session's watch and store
// client are read when the policy acts, not now.
func (r *run) newStragglerPolicy(ctx context.Context) *straggler.Policy {
	tc := r.cfg.Telemetry
	cfg := straggler.Config{
		Log: r.log, Action: tc.StragglerAction, Confirm: tc.StragglerConfirm,
		MinNodes: r.cfg.Rendezvous.NNodesMin, MaxRestarts: r.cfg.MaxRestarts,
		Restart: func(gen uint64, seen time.Time, se *straggler.Error) { r.faults.Report(fault.Straggler(gen, seen, se)) },
		Drain: func(se *straggler.Error) {
			r.faults.Report(fault.Straggler(0, time.Now(), se))
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

// startTelemetry starts observing the job (package observe): the
// collective watch, its exporter and the host monitor, with the run's
// policy: a hang is a fault, a persistent straggler goes to the straggler
// policy, the notifiers hear of it. The returned func flushes and closes
// them.
func (r *run) startTelemetry(ctx context.Context) (func(), error) {
	traceDir := ""
	if r.keep {
		traceDir = r.runDir
	}
	policy := observe.Policy{RankOf: r.authorize, ReadGPU: observe.ReadGPU(r.cfg.GPUs.state()),
		OnHang: func(h *watch.HangError) { r.faults.Report(fault.Hang(h)) }, OnStragglers: r.stragglers.Look}
	if r.cfg.Spares > 0 {
		// The leader's hang, on a follower: its own ranks that never
		// arrived may be its spares' to take (replaceHung).
		policy.OnRemoteHang = func(h telemetry.Hang) { r.faults.Report(fault.Hang(&watch.HangError{Hang: h, Remote: true})) }
	}
	if r.plugins != nil {
		policy.Notify = r.plugins.Notify
	}
	o, err := observe.Open(ctx, r.cfg.Telemetry.Config, observe.Job{ID: r.runID, NodeRank: r.cfg.Rendezvous.NodeRank,
		Topology: r.cfg.GPUs.topology(), TraceDir: traceDir, Metrics: true, Health: r.health, Log: r.log}, policy)
	if err != nil {
		return nil, err
	}
	r.obs, r.watch, r.exp, r.mon = o, o.Watch, o.Exp, o.Mon
	if pub, ok := r.j.rz.(watch.Publisher); ok {
		r.goBackground(func() { r.watch.Publish(ctx, pub) })
	}
	r.goBackground(func() { _ = o.Run(ctx) })
	return func() { o.Close(ctx) }, nil
}

// startMonitors starts the GPU health watch, whose findings that call for
// a restart, a reset or a drain are faults.
func (r *run) startMonitors(ctx context.Context) {
	r.goBackground(func() { r.watchGPUs(ctx, r.faults.Report) })
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
	r.probeIfPeerLost(ev)
}

package agent

import (
	"context"
	"fmt"
	"sync"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// session is what one Run holds for the job's life: the rendezvous, the
// control socket, the host monitor, the collective watch and its exporter,
// and the queue every fault source reports to.
type session struct {
	runID  string
	runDir string
	keep   bool // runDir is kept after the run (a log dir)

	j      *joined
	srv    *control.Server
	srvCtx context.Context // the control socket's: it outlives the run's ctx
	mon    *hostmon.Monitor
	events *eventTally
	watch  *watch.Watch
	exp    watch.Exporter
	faults *faults
	// stragglers acts on confirmed persistent stragglers
	// (--straggler-action); the watch hands it what it names.
	stragglers *straggler.Policy
	// plugins runs the --plugin processes; nil without any.
	plugins *pluginhost.Host
	named   pluginhost.NamedStragglers // the stragglers the notifiers were told of
	health  *loopHealth                // the loop's phase, for /healthz and /readyz

	bg   sync.WaitGroup // the background parts, waited for at the end of Run
	left bool           // this node left the rendezvous (or needs not)
}

// leave takes this node out of the job, once.
func (s *session) leave(reason string) {
	if !s.left {
		s.left = true
		s.j.rz.Leave(reason)
	}
}

// abort tells the workers' shims to abort their communicators, so a
// collective hung on a dead peer returns; best effort, and never allowed
// to delay the stop (a wedged connection can take seconds to time out).
func (s *session) abort(reason string) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		s.srv.Abort(reason)
	}()
}

// goBackground runs f on its own goroutine until it returns; Run waits
// for it.
func (s *session) goBackground(f func()) {
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		f()
	}()
}

// startTelemetry starts the collective watch and its exporter; the
// returned func flushes and closes them.
func (a *Agent) startTelemetry(ctx context.Context, s *session) (func(), error) {
	var readGPU func(string) (watch.GPUReading, error)
	if a.gpus != nil && a.gpus.State != nil {
		readGPU = func(uuid string) (watch.GPUReading, error) {
			st, err := a.gpus.State(uuid)
			if err != nil {
				return watch.GPUReading{}, err
			}
			return watch.GPUReading{State: st.String(), Slowdown: st.Slowdown()}, nil
		}
	}
	s.watch = watch.New(watch.Config{Log: a.log, HangTimeout: a.cfg.Telemetry.HangTimeout, HangAuto: a.cfg.Telemetry.HangAuto,
		StragglerCost: a.cfg.Telemetry.StragglerCost, RankOf: a.authorize, ReadGPU: readGPU, ReadHost: s.mon.Slowdown,
		OnStragglers: func(named []telemetry.Straggler) { s.notifyStragglers(named); s.stragglers.Look(named) }, OnHang: func(h *watch.HangError) { s.faults.report(hangFault(h)) }})
	exp, closeExp, err := a.openExporter(ctx, s.runID, s.runDir, s.keep, s.watch.Worker, s.health)
	if err != nil {
		s.watch.Close()
		return nil, err
	}
	s.exp = exp
	s.watch.SetExporter(exp)
	if pub, ok := s.j.rz.(watch.Publisher); ok {
		s.goBackground(func() { s.watch.Publish(ctx, pub) })
	}
	s.goBackground(func() { s.watch.Run(ctx) })
	return func() {
		closeExp()
		s.watch.Close()
	}, nil
}

// startControl starts the control socket the workers' shims dial; the
// returned func stops it.
func (a *Agent) startControl(ctx context.Context, s *session) (func(), error) {
	onEvents := func(rank int, ev wire.Events) {
		s.events.add(rank, ev)
		s.watch.Add(rank, ev)
	}
	srv, err := control.Listen(control.Config{JobID: s.runID, Logger: a.log, KV: s.j.kv}, control.PIDAdmission{Authorize: a.authorize, OnEvents: onEvents})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	s.srv = srv
	// The control socket outlives ctx: when a signal stops the job, the
	// workers must still receive Abort while they are being stopped.
	srvCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	s.srvCtx = srvCtx
	s.goBackground(func() {
		if err := srv.Run(srvCtx); err != nil {
			a.log.Error("control socket stopped", "err", err)
		}
	})
	return stop, nil
}

// startMonitors starts the host monitor and the GPU health watch, whose
// findings that call for a restart, a reset or a drain are faults.
func (a *Agent) startMonitors(ctx context.Context, s *session) {
	s.goBackground(func() { _ = s.mon.Run(ctx) })
	s.goBackground(func() { a.watchGPUs(ctx, s.faults.report) })
}

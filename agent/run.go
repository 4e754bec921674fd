package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/fault"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/join"
	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
	"github.com/ddp-agent/ddp-agent/agent/rundir"
	"github.com/ddp-agent/ddp-agent/agent/straggler"
	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// run is one run of the job by an Agent: what lives for the run (the
// rendezvous, the control socket, the host monitor, the collective watch
// and its exporter, the plugins, the queue every fault source reports
// to), and the loop over its attempts, whose methods are start, wait,
// recover, failAttempt, succeed and stop.
type run struct {
	*Agent // what lives from construction; never changed by the run

	runID  string
	dir    *rundir.Dir
	runDir string // dir's path
	keep   bool   // runDir is kept after the run (a log dir)

	j      *joined
	srv    *control.Server
	srvCtx context.Context  // the control socket's: it outlives the run's ctx
	mon    *hostmon.Monitor // the observer's
	events *eventTally
	obs    *observe.Observer // the watch, exporter and host monitor below
	watch  *watch.Watch
	exp    watch.Exporter
	faults *fault.Queue
	// stragglers acts on confirmed persistent stragglers
	// (--straggler-action); the watch hands it what it names.
	stragglers *straggler.Policy
	// plugins runs the --plugin processes; nil without any.
	plugins *pluginhost.Host
	health  *loopHealth   // the loop's phase, for /healthz and /readyz
	losses  rundir.Losses // worker log files that miss output, for the exit summary
	// reformed fires when a worker reports a re-formation in process
	// (refill and awaitRemoteSpares wait for it).
	reformed reformSignal
	// probing: a probe of the other agents, for a collective failed on a
	// lost peer, is under way (probeIfPeerLost)
	probing sync.Mutex

	bg   sync.WaitGroup // the background parts, waited for at the end of the run
	left bool           // this node left the rendezvous (or needs not)

	mu         sync.Mutex
	last       *attempt          // the latest attempt started, for the job's end notice
	group      *supervisor.Group // the current attempt, for the control socket's admission check
	rankOffset int               // its global rank of local rank 0, for the GPU health watcher
}

func newRun(a *Agent, runID string, dir *rundir.Dir) *run {
	return &run{Agent: a, runID: runID, dir: dir, runDir: dir.Path, keep: dir.Keep, events: newEventTally(), faults: fault.NewQueue(),
		health: newLoopHealth(time.Now)}
}

// execute sets the run up, runs the loop, and tears the run down in the
// reverse order.
func (r *run) execute(ctx context.Context) (err error) {
	defer r.dir.Remove()
	defer r.losses.Summarize(r.log) // the last lines of the run: every worker stream has ended

	ctx, cancel := context.WithCancelCause(ctx)
	stopHealth := context.AfterFunc(ctx, func() { r.health.stop(ctx) })
	defer stopHealth()
	r.stragglers = r.newStragglerPolicy(ctx)
	// Last: the notifiers deliver the job's last events, then stop. The
	// job's end is told after the background parts are gone, so nothing
	// (a GPU fault) comes after it.
	defer func() {
		if r.plugins != nil {
			r.mu.Lock()
			last := r.last
			r.mu.Unlock()
			r.tell(event{kind: evEnded, at: last, err: err}) // the attempt and generation it ended in
			r.plugins.Close(pluginFlush)
		}
	}()
	defer r.bg.Wait()
	defer cancel(nil) // runs first: stop the background parts, then wait for them
	if err := r.startPlugins(); err != nil {
		return err
	}

	// A drain finding (a plugin, a GPU) can come while the rendezvous
	// waits for its nodes: the node must still exit as drained, not with
	// the cancelled wait's error.
	jctx, stopJoin := r.faults.Bound(ctx)
	r.j, err = r.openRendezvous(jctx)
	stopJoin()
	if err != nil {
		return r.drainOr(ctx, err)
	}
	defer r.j.close()
	defer r.leave("agent exiting") // unless it left already: drained, failed, succeeded
	closeTelemetry, err := r.startTelemetry(ctx)
	if err != nil {
		return r.drainOr(ctx, err)
	}
	defer closeTelemetry()
	stopControl, err := r.startControl(ctx)
	if err != nil {
		return err
	}
	defer stopControl() // runs before bg.Wait
	r.startMonitors(ctx)

	r.log.Info("starting job", "job", r.runID, "nproc_per_node", r.cfg.NProcPerNode, "gpus", r.cfg.GPUs.summary(),
		"nnodes", r.cfg.nnodes(), "max_restarts", r.cfg.MaxRestarts, "command", r.cfg.Command,
		"log_dir", rundir.LogAttr(r.runDir, r.keep), "control_socket", r.srv.Path())
	r.tell(event{kind: evStarted, started: startedJob{runID: r.runID, command: strings.Join(r.cfg.Command, " "),
		nproc: r.cfg.NProcPerNode, nnodes: r.cfg.nnodes()}})
	return r.loop(ctx)
}

// drainOr ends the run with a drain of this node found meanwhile, if one
// is queued, rather than with err: a drain that came while the rendezvous
// waited for its nodes ends that wait, and the node must exit as drained.
func (r *run) drainOr(ctx context.Context, err error) error {
	if f := r.faults.Drain(); f != nil {
		_, err := r.recover(ctx, nil, f)
		return err
	}
	return err
}

// leave takes this node out of the job, once.
func (r *run) leave(reason string) {
	if !r.left {
		r.left = true
		r.j.rz.Leave(reason)
	}
}

// abort tells the workers' shims to abort their communicators, so a
// collective hung on a dead peer returns; best effort, and never allowed
// to delay the stop (a wedged connection can take seconds to time out).
func (r *run) abort(reason string) {
	r.goBackground(func() { r.srv.Abort(reason) })
}

// goBackground runs f on its own goroutine until it returns; the run
// waits for it.
func (r *run) goBackground(f func()) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		f()
	}()
}

// onReformed takes a worker's report of a re-formation in process.
func (r *run) onReformed(rank int, gen uint64, m wire.Reformed) {
	r.obs.Reformed(rank, gen, m)
	r.reformed.fire()
}

func (r *run) setGroup(g *supervisor.Group, rankOffset int) {
	r.mu.Lock()
	r.group, r.rankOffset = g, rankOffset
	r.mu.Unlock()
}

// authorize admits a control-socket peer only if it is a worker of the
// current attempt or one of its descendants.
func (r *run) authorize(pid int) (int, error) {
	r.mu.Lock()
	g := r.group
	r.mu.Unlock()
	if g == nil {
		return 0, errors.New("no workers running")
	}
	return g.RankOf(pid)
}

// joined is the job this agent joined (package join), as the run uses it.
type joined struct {
	rz join.Rendezvous
	// kv backs the control socket's KVSet/KVGet: the job-wide store, or
	// nil for the agent's in-memory one.
	kv control.KV
	// nodeLocalKV: the workers of other nodes cannot see kv, so they must
	// bootstrap through torch's store (DDP_AGENT_BOOTSTRAP=external).
	nodeLocalKV bool
	endpoint    string // the store, for logs and `ddp-agent status`
	// cli is the store's client (nil without a store), for the agent's
	// own reads of the job's status.
	cli   *store.Client
	close func()
}

// openRendezvous joins the job with the backend of Config.Rendezvous
// (join.Open).
func (r *run) openRendezvous(ctx context.Context) (*joined, error) {
	j, err := join.Open(ctx, r.cfg.Rendezvous,
		join.Node{JobID: r.runID, NProc: r.cfg.NProcPerNode, MaxRestarts: r.cfg.MaxRestarts, GPUs: r.cfg.GPUs.node(),
			AgentStore: len(r.cfg.StoreCommand) > 0}, r.log)
	if err != nil {
		return nil, err
	}
	out := &joined{rz: j.Rendezvous, nodeLocalKV: j.NodeLocalKV, endpoint: j.Endpoint, cli: j.Client, close: j.Close}
	if j.KV != nil { // a nil *store.KV must not become a non-nil control.KV
		out.kv = j.KV
	}
	return out, nil
}

// startControl starts the control socket the workers' shims dial; the
// returned func stops it.
func (r *run) startControl(ctx context.Context) (func(), error) {
	srv, err := control.Listen(control.Config{JobID: r.runID, Logger: r.log, KV: r.j.kv},
		control.PIDAdmission{Authorize: r.authorize, OnEvents: r.onEvents, OnReformed: r.onReformed})
	if err != nil {
		return nil, fmt.Errorf("control socket: %w", err)
	}
	r.srv = srv
	// The control socket outlives ctx: when a signal stops the job, the
	// workers must still receive Abort while they are being stopped.
	srvCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	r.srvCtx = srvCtx
	r.goBackground(func() {
		if err := srv.Run(srvCtx); err != nil {
			r.log.Error("control socket stopped", "err", err)
		}
	})
	return stop, nil
}

// pluginFlush is how long the agent waits at exit for the notifiers to
// deliver what they hold (the job's last events among them).
const pluginFlush = 5 * time.Second

// startPlugins starts the plugins; a detector's finding that restarts the
// workers or drains the node is a fault, with that severity. Without
// --plugin it starts nothing (a nil host notifies nothing).
func (r *run) startPlugins() error {
	p := r.cfg.Plugins
	if len(p.Specs) == 0 {
		return nil
	}
	cfg := pluginhost.Config{Specs: p.Specs, Job: r.runID, Dir: pluginhost.BundledDir(p.Dir)}
	cfg.OnFinding = func(f pluginhost.Finding) { r.faults.Report(fault.Plugin(&fault.PluginError{Finding: f})) }
	cfg.Attempt = func() (uint64, int) { // for the events told from outside the loop
		r.mu.Lock()
		defer r.mu.Unlock()
		if r.last == nil {
			return 0, 0
		}
		return r.last.gen, r.last.n
	}
	h, err := pluginhost.Start(cfg, r.log)
	if err != nil {
		return err
	}
	r.plugins = h
	return nil
}

// Package sidecar is ddp-agent beside a launcher it does not replace
// (torchrun, srun, a Kubeflow job): one per node and user, launching
// nothing. The hooks of the node's workers find its control socket on
// their own (a well-known per-user path, or $DDP_AGENT_SOCKET), say which
// job, rank and generation they are, and send their events; the sidecar
// watches each job as ddp-agent run watches its one: stalls and
// stragglers named, hangs reported with the missing ranks' Python stacks,
// traces, metrics and Perfetto files, GPU health, plugins. It cannot
// restart workers it does not own: it aborts their communicators (the
// control socket's Abort), so that they fail at once with the reason and
// their launcher restarts them. Across nodes, the sidecar of the job's
// node 0 analyzes every rank, as ddp-agent run's leader does; the relay's
// endpoint travels through the workers (relaykv.go).
package sidecar

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/pluginhost"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/wire"
)

// DefaultLinger is how long a job whose workers all disconnected is kept:
// the launcher's restart brings them back within it.
const DefaultLinger = time.Minute

// maxJobs bounds the jobs one sidecar watches at once (each holds a watch,
// an exporter and a monitor): far above a node's real jobs.
const maxJobs = 64

// Config configures a Sidecar.
type Config struct {
	Socket string // the control socket; "": DefaultSocket
	LogDir string // per job, LogDir/<job>: the Perfetto files; "": none
	// Telemetry is what each job's observer watches and exports, as
	// ddp-agent run's; its MetricsAddr serves every job's metrics, each
	// series labelled with its job.
	Telemetry observe.Config
	Linger    time.Duration // 0: DefaultLinger
	Plugins   []pluginhost.Spec
	PluginDir string
	GPUs      *GPUs // nil: a CPU node
}

// GPUs is what the sidecar uses of the node's GPUs.
type GPUs struct {
	Topology *nvml.Topology
	// Watch makes the health watcher over the node's NVML; nil: none.
	Watch observe.NewWatcher
	// State reads a GPU's state now, for a straggler's evidence; nil: none.
	State func(uuid string) (nvml.GPUState, error)
}

var errJobClosing = errors.New("the job is closing on this sidecar: retry")

// Sidecar serves the node's control socket for the workers of every job
// of its user. Its methods are safe for concurrent use.
type Sidecar struct {
	cfg     Config
	log     *slog.Logger
	ctx     context.Context
	srv     *control.Server
	plugins *pluginhost.Host

	// hub serves every job's metrics on --metrics-addr; nil without it.
	hub *export.Hub

	mu   sync.Mutex
	jobs map[string]*job
}

// New checks cfg and binds the socket (clearing a dead sidecar's).
func New(cfg Config, log *slog.Logger) (*Sidecar, error) {
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.Socket == "" {
		cfg.Socket = DefaultSocket(os.Getuid(), os.Getenv)
	}
	sc := &Sidecar{cfg: cfg, log: log, jobs: map[string]*job{}}
	if err := checkDir(filepath.Dir(cfg.Socket)); err != nil {
		return nil, err
	}
	if err := clearStale(cfg.Socket); err != nil {
		return nil, fmt.Errorf("sidecar socket: %w", err)
	}
	if addr := cfg.Telemetry.MetricsAddr; addr != "" {
		hub, err := export.ServeHub(addr, log)
		if err != nil {
			return nil, err
		}
		sc.hub = hub
	}
	srv, err := control.ListenSidecar(control.Config{Dir: filepath.Dir(cfg.Socket), SocketName: filepath.Base(cfg.Socket), Logger: log}, sc)
	if err != nil {
		if sc.hub != nil {
			_ = sc.hub.Close(context.Background())
		}
		return nil, err
	}
	sc.srv = srv
	return sc, nil
}

// Path is the socket's path.
func (sc *Sidecar) Path() string { return sc.srv.Path() }

// Run serves until ctx is done, then closes every job (their traces
// flushed) and removes the socket.
func (sc *Sidecar) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sc.mu.Lock()
	sc.ctx = ctx
	sc.mu.Unlock()
	if err := sc.startPlugins(); err != nil {
		// the socket is bound: serve it briefly so that Run releases it
		cancel()
		_ = sc.srv.Run(ctx)
		return err
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		sc.watchGPUs(ctx)
	}()
	sc.log.Info("sidecar serving", "socket", sc.srv.Path(), "hang_timeout", sc.cfg.Telemetry.HangTimeout, "log_dir", sc.cfg.LogDir,
		"plugins", len(sc.cfg.Plugins), "gpus", sc.topology())
	err := sc.srv.Run(ctx)
	wg.Wait()
	// The directory of the jobs' stacks and the socket's, when empty: the
	// control server left the socket's while the stacks were there. Those
	// of jobs still running stay, for the next sidecar.
	os.Remove(filepath.Join(filepath.Dir(sc.cfg.Socket), "stacks"))
	os.Remove(filepath.Dir(sc.cfg.Socket))
	sc.mu.Lock()
	jobs := sc.jobs
	sc.jobs = map[string]*job{}
	sc.mu.Unlock()
	for _, j := range jobs {
		j.close()
	}
	if sc.plugins != nil {
		sc.plugins.Close(5 * time.Second)
	}
	if sc.hub != nil {
		hctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = sc.hub.Close(hctx)
		cancel()
	}
	return err
}

// Admit is control.Sidecar's: a worker's Hello makes or joins its job.
func (sc *Sidecar) Admit(p control.Peer) (wire.Welcome, error) {
	w, err := parseHello(p.Hello)
	if err != nil {
		return wire.Welcome{}, &wire.RemoteError{Code: wire.CodeBadRequest, Message: err.Error()}
	}
	for range 3 { // a job closing as its worker returns: the next try opens it anew
		j, err := sc.job(w)
		if err != nil {
			return wire.Welcome{}, err
		}
		wel, err := j.admit(p, w)
		if !errors.Is(err, errJobClosing) {
			if err == nil {
				sc.log.Debug("worker connected", "job", w.job, "rank", w.rank, "generation", w.gen, "pid", p.PID)
			}
			return wel, err
		}
	}
	// Worth a redial: CodeDenied would make the shim give up on this sidecar.
	return wire.Welcome{}, &wire.RemoteError{Code: wire.CodeInternal, Message: errJobClosing.Error()}
}

// job returns w's job, opening it on its first worker.
func (sc *Sidecar) job(w worker) (*job, error) {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if j := sc.jobs[w.job]; j != nil {
		return j, nil
	}
	if sc.ctx == nil || sc.ctx.Err() != nil {
		return nil, &wire.RemoteError{Code: wire.CodeInternal, Message: "the sidecar is stopping"}
	}
	if len(sc.jobs) >= maxJobs {
		return nil, fmt.Errorf("%d jobs watched already, the most one sidecar takes", maxJobs)
	}
	j, err := sc.openJob(w)
	if err != nil {
		return nil, err
	}
	sc.jobs[w.job] = j
	return j, nil
}

func (sc *Sidecar) lookup(id string) *job {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.jobs[id]
}

// Events is control.Sidecar's.
func (sc *Sidecar) Events(p control.Peer, ev wire.Events) {
	if j := sc.lookup(p.Hello.Job[wire.HelloJob]); j != nil {
		j.events(p, ev)
	}
}

// Reformed is control.Sidecar's.
func (sc *Sidecar) Reformed(p control.Peer, m wire.Reformed) {
	if j := sc.lookup(p.Hello.Job[wire.HelloJob]); j != nil {
		j.obs.Reformed(int(p.Hello.Rank), p.Hello.Generation, m)
	}
}

// Left is control.Sidecar's.
func (sc *Sidecar) Left(p control.Peer) {
	if j := sc.lookup(p.Hello.Job[wire.HelloJob]); j != nil {
		j.leave(p)
	}
}

// closeIdle closes j if no worker came back during the linger time.
func (sc *Sidecar) closeIdle(j *job) {
	sc.mu.Lock()
	j.mu.Lock()
	idle := len(j.peers) == 0 && !j.closed
	if idle {
		j.closed = true
		if sc.jobs[j.id] == j {
			delete(sc.jobs, j.id)
		}
	}
	j.mu.Unlock()
	sc.mu.Unlock()
	if idle {
		j.closeAnd(true)
	}
}

// abortJob aborts the communicators of job's workers of generation gen
// (every generation when gen is negative), in the background.
func (sc *Sidecar) abortJob(id string, gen int64, reason string) {
	go func() {
		n := sc.srv.AbortPeers(func(p control.Peer) bool {
			return p.Hello.Job[wire.HelloJob] == id && (gen < 0 || p.Hello.Generation == uint64(gen))
		}, reason)
		sc.log.Warn("aborted the job's communicators on this node: their launcher restarts them", "job", id, "connections", n, "reason", reason)
	}()
}

// abortAll aborts every job's communicators on this node (a GPU or a
// plugin's finding that concerns the node).
func (sc *Sidecar) abortAll(reason string) {
	sc.mu.Lock()
	ids := make([]string, 0, len(sc.jobs))
	for id := range sc.jobs {
		ids = append(ids, id)
	}
	sc.mu.Unlock()
	for _, id := range ids {
		sc.abortJob(id, -1, reason)
	}
}

func (sc *Sidecar) topology() string {
	if sc.cfg.GPUs == nil || sc.cfg.GPUs.Topology == nil {
		return ""
	}
	return sc.cfg.GPUs.Topology.Summary()
}

// readGPU is the observers' ReadGPU; nil without NVML.
func (sc *Sidecar) readGPU() func(string) (watch.GPUReading, error) {
	if sc.cfg.GPUs == nil {
		return nil
	}
	return observe.ReadGPU(sc.cfg.GPUs.State)
}

package sidecar

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/export"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// job is what the sidecar watches of one job: its collective watch and
// exporter, the host monitor of its workers here, and its workers'
// connections. A job's generation follows the launcher's restarts
// (TORCHELASTIC_RESTART_COUNT): a Hello of a later one ends the attempt
// watched and begins the next.
type job struct {
	id      string
	sc      *Sidecar
	ctx     context.Context // the job's life on this node
	cancel  context.CancelFunc
	watch   *watch.Watch
	exp     *export.Exporter
	mon     *hostmon.Monitor
	kv      *relayKV
	bg      sync.WaitGroup
	mu      sync.Mutex
	gen     uint64
	begun   bool            // an attempt is watched
	end     chan struct{}   // closed when the attempt watched ends
	peers   map[uint64]peer // by control.Peer.ID
	linger  *time.Timer     // closes the job when its last worker left and none came back
	closed  bool
	metrics bool // the job holds the sidecar's Prometheus address
}

// peer is a connected worker: its pid as the sidecar sees it, and its Hello.
type peer struct {
	pid int
	worker
}

// openJob starts the watch and exporter of a job first seen in w's Hello.
func (sc *Sidecar) openJob(w worker) (*job, error) {
	j := &job{id: w.job, sc: sc, mon: hostmon.NewMonitor(sc.log.With("job", w.job)), kv: newRelayKV(), peers: map[uint64]peer{}}
	j.ctx, j.cancel = context.WithCancel(sc.ctx)
	log := sc.log.With("job", w.job)
	j.watch = watch.New(watch.Config{Log: log, HangTimeout: sc.cfg.HangTimeout, HangAuto: sc.cfg.HangAuto,
		StragglerCost: sc.cfg.StragglerCost, RankOf: j.rankOf, ReadGPU: sc.readGPU(), ReadHost: j.mon.Slowdown,
		OnStragglers: func(named []telemetry.Straggler) { sc.notifyStragglers(j.id, named) },
		OnHang:       func(h *watch.HangError) { j.hung(h.Hang, h.Error(), h.Report) },
		OnRemoteHang: func(h telemetry.Hang) {
			j.hung(h, fmt.Sprintf("the job's leading sidecar found a hang in step %d bucket %d", h.Step, h.Bucket), "")
		}})
	host, _ := os.Hostname()
	traceDir := ""
	if sc.cfg.LogDir != "" {
		traceDir = filepath.Join(sc.cfg.LogDir, dirName(w.job))
		if err := os.MkdirAll(traceDir, 0o755); err != nil {
			j.cancel()
			return nil, fmt.Errorf("job %s: %w", w.job, err)
		}
	}
	metrics := sc.takeMetrics()
	exp, err := export.New(j.ctx, export.Config{JobID: w.job, NodeRank: w.groupRank, Host: host, Topology: sc.topology(),
		Endpoint: sc.cfg.OTelEndpoint, Protocol: sc.cfg.OTLPProtocol, SampleRatio: sc.cfg.TraceSample, TraceDir: traceDir,
		MetricsAddr: metrics, Worker: j.watch.Worker, Logger: log})
	if err != nil {
		sc.metricsUsed = sc.metricsUsed && metrics == ""
		j.cancel()
		return nil, fmt.Errorf("job %s: telemetry: %w", w.job, err)
	}
	j.metrics = metrics != ""
	if u := exp.MetricsURL(); u != "" {
		log.Info("Prometheus metrics", "url", u)
	}
	j.exp = exp
	j.watch.SetExporter(exp)
	j.bg.Add(2)
	go func() { defer j.bg.Done(); j.watch.Run(j.ctx) }()
	go func() { defer j.bg.Done(); _ = j.mon.Run(j.ctx) }()
	log.Info("watching a new job", "world_size", w.world, "nnodes", w.nnodes(), "group_rank", w.groupRank, "trace_dir", traceDir)
	return j, nil
}

// dirName makes a job id a directory name.
func dirName(id string) string {
	if strings.Trim(id, ".") == "" {
		return strings.Repeat("_", len(id)) // "." and ".." are not names of their own
	}
	return strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') {
			return r
		}
		return '_'
	}, id)
}

// admit takes a worker of the job in: a Hello of a new generation begins
// its attempt, one of an older is refused. The Welcome carries the
// leading sidecar's relay endpoint when this sidecar leads the job.
func (j *job) admit(p control.Peer, w worker) (wire.Welcome, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return wire.Welcome{}, errJobClosing
	}
	switch {
	case j.begun && w.gen < j.gen:
		return wire.Welcome{}, &wire.RemoteError{Code: wire.CodeStaleGeneration,
			Message: fmt.Sprintf("job %s is at generation %d, this worker is of %d", j.id, j.gen, w.gen)}
	case !j.begun || w.gen > j.gen:
		j.begin(w)
	}
	if j.linger != nil {
		j.linger.Stop()
		j.linger = nil
	}
	j.peers[p.ID] = peer{pid: p.PID, worker: w}
	j.setMonitored()
	return wire.Welcome{JobID: j.id, Generation: j.gen, WorldSize: int32(w.world), Rank: int32(w.rank),
		Config: map[string]string{wire.WelcomeRelay: j.kv.published()}}, nil
}

// begin ends the attempt watched, if any, and begins w's (j.mu held). It
// blocks while the relay plan is made: bounded by the watch (a leader's
// listen, a follower's dial).
func (j *job) begin(w worker) {
	if j.begun {
		j.watch.End()
		close(j.end)
		j.sc.log.Info("job restarted by its launcher: watching the next generation", "job", j.id, "from", j.gen, "to", w.gen)
	}
	j.gen, j.begun, j.end = w.gen, true, make(chan struct{})
	if w.relay != "" {
		_ = j.kv.Set(j.ctx, watch.LeaderKey(j.id, w.gen), []byte(w.relay))
	}
	var kv control.KV
	// The leader publishes; a follower needs the leader's endpoint from
	// its Hello. Without it, each node's sidecar watches its own ranks.
	switch {
	case w.nnodes() > 1 && (w.groupRank == 0 || w.relay != ""):
		kv = j.kv
	case w.nnodes() > 1:
		j.sc.log.Info("no relay endpoint from rank 0's hook (no sidecar on its node?): this sidecar analyzes its own ranks only",
			"job", j.id, "generation", w.gen, "group_rank", w.groupRank)
	}
	host, _ := os.Hostname()
	workers := make([]telemetry.Worker, w.localWorld)
	for lr := range workers {
		workers[lr] = telemetry.Worker{Rank: w.offset() + lr, LocalRank: lr, Host: host, GPUIndex: -1}
	}
	masterAddr := w.masterAddr
	if masterAddr == "" {
		masterAddr = "127.0.0.1"
	}
	j.watch.Begin(j.ctx, watch.Attempt{Gen: w.gen, GroupRank: w.groupRank, NNodes: w.nnodes(), WorldSize: w.world,
		RankOffset: w.offset(), MasterAddr: masterAddr, Done: j.end, Workers: workers, StackDir: w.stackDir,
		KV: kv, JobID: j.id})
}

// leave forgets a worker's connection; the job closes once its last worker
// is gone for the sidecar's linger time.
func (j *job) leave(p control.Peer) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.peers, p.ID)
	j.setMonitored()
	if len(j.peers) == 0 && !j.closed && j.linger == nil {
		j.linger = time.AfterFunc(j.sc.cfg.Linger, func() { j.sc.closeIdle(j) })
	}
}

// setMonitored gives the host monitor the workers connected (j.mu held).
func (j *job) setMonitored() {
	pids := map[int]int{}
	for _, p := range j.peers {
		if p.pid > 0 && p.gen == j.gen {
			pids[p.rank] = p.pid
		}
	}
	j.mon.SetWorkers(pids)
}

// rankOf is the watch's RankOf: only a connected worker of the current
// generation is sent SIGUSR2 for its stack.
func (j *job) rankOf(pid int) (int, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, p := range j.peers {
		if p.pid == pid && p.gen == j.gen {
			return p.rank, nil
		}
	}
	return 0, fmt.Errorf("pid %d is no connected worker of job %s", pid, j.id)
}

// events feeds a worker's events to the watch, unless they are of a
// generation no longer watched.
func (j *job) events(p control.Peer, ev wire.Events) {
	j.mu.Lock()
	cur := j.begun && p.Hello.Generation == j.gen
	j.mu.Unlock()
	if cur {
		j.watch.Add(int(p.Hello.Rank), ev)
	}
}

// hung aborts the communicators of the job's workers here, so that they
// fail now with the reason and their launcher restarts them; the stacks
// were collected first (by the watch, before OnHang). It never blocks.
func (j *job) hung(h telemetry.Hang, reason, report string) {
	j.mu.Lock()
	gen := j.gen
	j.mu.Unlock()
	j.sc.notifyHang(j.id, gen, h, reason, report)
	j.sc.abortJob(j.id, int64(gen), "ddp-agent sidecar: "+reason)
}

// close ends the job: its watch, its exporter (flushed: the Perfetto
// file is complete after it), its monitor.
func (j *job) close() {
	j.mu.Lock()
	if j.linger != nil {
		j.linger.Stop()
	}
	if j.begun {
		j.watch.End()
		close(j.end)
		j.begun = false
	}
	j.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(j.ctx), 5*time.Second)
	defer cancel()
	if err := j.exp.Shutdown(ctx); err != nil {
		j.sc.log.Warn("telemetry shutdown", "job", j.id, "err", err)
	}
	j.cancel()
	j.bg.Wait()
	j.watch.Close()
	j.sc.log.Info("job closed: no worker connected", "job", j.id, "linger", j.sc.cfg.Linger)
}

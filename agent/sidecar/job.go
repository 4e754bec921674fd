package sidecar

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/hostmon"
	"github.com/ddp-agent/ddp-agent/agent/observe"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
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
	obs     *observe.Observer // the job's watch, exporter and host monitor
	watch   *watch.Watch      // obs's
	mon     *hostmon.Monitor  // obs's
	kv      *relayKV
	bg      sync.WaitGroup
	planMu  sync.Mutex // serializes the attempts' relay plans (watch.Begin), which may take seconds
	mu      sync.Mutex
	gen     uint64
	shape   shape           // the attempt's job as its first worker described it
	planned chan struct{}   // closed when the attempt's plan is made
	begun   bool            // an attempt is watched
	end     chan struct{}   // closed when the attempt watched ends
	peers   map[uint64]peer // by control.Peer.ID
	linger  *time.Timer     // closes the job when its last worker left and none came back
	closed  bool
}

// peer is a connected worker: its pid as the sidecar sees it, and its Hello.
type peer struct {
	pid int
	worker
}

// openJob starts observing a job first seen in w's Hello (package
// observe), with the sidecar's policy: a hang aborts the job's
// communicators here, a persistent straggler is told to the notifiers.
func (sc *Sidecar) openJob(w worker) (*job, error) {
	j := &job{id: w.job, sc: sc, kv: newRelayKV(), peers: map[uint64]peer{}}
	j.ctx, j.cancel = context.WithCancel(sc.ctx)
	log := sc.log.With("job", w.job)
	traceDir := ""
	if sc.cfg.LogDir != "" {
		traceDir = filepath.Join(sc.cfg.LogDir, dirName(w.job))
		if err := os.MkdirAll(traceDir, 0o755); err != nil {
			j.cancel()
			return nil, fmt.Errorf("job %s: %w", w.job, err)
		}
	}
	policy := observe.Policy{RankOf: j.rankOf, ReadGPU: sc.readGPU(),
		OnHang: func(h *watch.HangError) { j.hung(h.Hang, h.Error(), h.Report) },
		OnRemoteHang: func(h telemetry.Hang) {
			j.hung(h, fmt.Sprintf("the job's leading sidecar found a hang in step %d bucket %d", h.Step, h.Bucket), "")
		}}
	if sc.plugins != nil {
		policy.Notify = func(ev notifier.Event) {
			ev.Job = j.id
			sc.notify(ev)
		}
	}
	obs, err := observe.Open(j.ctx, sc.cfg.Telemetry, observe.Job{ID: w.job, NodeRank: w.groupRank, Topology: sc.topology(),
		TraceDir: traceDir, Hub: sc.hub, Log: log}, policy)
	if err != nil {
		j.cancel()
		return nil, fmt.Errorf("job %s: %w", w.job, err)
	}
	j.obs, j.watch, j.mon = obs, obs.Watch, obs.Mon
	j.bg.Add(1)
	go func() { defer j.bg.Done(); _ = obs.Run(j.ctx) }()
	log.Info("watching a new job", "world_size", w.world, "nnodes", w.nnodes(), "group_rank", w.groupRank, "trace_dir", traceDir)
	return j, nil
}

// dirName makes a job id a directory name: letters, digits, '.', '_' and
// '-' kept, anything else '_'; a name changed so, or long, gets a hash of
// the id, so that two ids never share a directory. ddp_agent/_sidecar.py
// computes the same.
func dirName(id string) string {
	name := strings.Map(func(r rune) rune {
		if r == '-' || r == '_' || r == '.' || ('a' <= r && r <= 'z') || ('A' <= r && r <= 'Z') || ('0' <= r && r <= '9') {
			return r
		}
		return '_'
	}, id)
	if name == id && len(id) <= 64 && strings.Trim(id, ".") != "" {
		return name
	}
	sum := sha256.Sum256([]byte(id))
	return name[:min(len(name), 48)] + "-" + hex.EncodeToString(sum[:4])
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

// hung aborts the communicators of the job's workers of the hung
// generation here, so that they fail now with the reason and their
// launcher restarts them; the stacks were collected first (by the watch,
// before OnHang). The watch calls it under its own lock: it takes none
// and never blocks.
func (j *job) hung(h telemetry.Hang, reason, report string) {
	go func() {
		j.sc.notifyHang(j.id, h, reason, report)
		j.sc.abortJob(j.id, int64(h.Gen), "ddp-agent sidecar: "+reason)
	}()
}

// close ends the job: its watch, its exporter (flushed: the Perfetto
// file is complete after it), its monitor.
func (j *job) close() { j.closeAnd(false) }

// closeAnd closes the job; with dropStacks (its workers are gone: the
// linger time passed) its stack files go too. At the sidecar's exit they
// stay: the workers train on and redial the next sidecar.
func (j *job) closeAnd(dropStacks bool) {
	j.mu.Lock()
	j.closed = true
	if j.linger != nil {
		j.linger.Stop()
	}
	j.mu.Unlock()
	j.planMu.Lock() // a plan in flight ends first
	j.mu.Lock()
	j.endAttempt()
	j.mu.Unlock()
	j.planMu.Unlock()
	j.obs.Close(j.ctx) // flushed: the Perfetto file is complete after it
	j.cancel()
	j.bg.Wait()
	if dropStacks {
		os.RemoveAll(filepath.Join(filepath.Dir(j.sc.cfg.Socket), "stacks", dirName(j.id)))
	}
	j.sc.log.Info("job closed", "job", j.id)
}

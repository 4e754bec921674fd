package sidecar

import (
	"fmt"
	"os"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/control"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
	"github.com/ddp-agent/ddp-agent/wire"
)

// shape is what must stay the same within one attempt: a worker that
// describes the job otherwise belongs to another run of it.
type shape struct {
	world, localWorld, groupRank int
	masterAddr                   string
}

func shapeOf(w worker) shape {
	return shape{world: w.world, localWorld: w.localWorld, groupRank: w.groupRank, masterAddr: w.masterAddr}
}

// relayWelcomeWait bounds how long rank 0's Welcome waits for the relay
// plan, below the shim's dial timeout (sidecarDial, 5 s).
const relayWelcomeWait = 4 * time.Second

// fresh decides whether w begins a new attempt of the job (j.mu held): the
// first worker, a later generation (the launcher restarted the job), a
// job with no worker connected (a run again under the same id: torchrun's
// default --rdzv-id, an elastic change that kept the restart count), or
// one whose shape changed. A worker of an older generation while newer
// ones are connected is refused. Pure but for j's fields.
func (j *job) fresh(w worker) (bool, error) {
	switch {
	case !j.begun || len(j.peers) == 0 || w.gen > j.gen:
		return true, nil
	case w.gen < j.gen:
		return false, &wire.RemoteError{Code: wire.CodeStaleGeneration,
			Message: fmt.Sprintf("job %s is at generation %d, this worker is of %d", j.id, j.gen, w.gen)}
	}
	return shapeOf(w) != j.shape, nil
}

// admit takes a worker of the job in, beginning a new attempt when it
// starts one. The relay plan runs outside j.mu (events, the stack
// requests and the other workers' admission go on meanwhile); rank 0 of a
// multi-node job waits for it, since its Welcome carries the leading
// sidecar's relay endpoint.
func (j *job) admit(p control.Peer, w worker) (wire.Welcome, error) {
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return wire.Welcome{}, errJobClosing
	}
	fresh, err := j.fresh(w)
	if err != nil {
		j.mu.Unlock()
		return wire.Welcome{}, err
	}
	var restarted []uint64 // the generations the launcher restarted
	if fresh {
		if j.begun {
			j.sc.log.Info("a new attempt of the job: watching it", "job", j.id, "from_generation", j.gen, "to_generation", w.gen)
			for g := j.gen; g < w.gen; g++ {
				restarted = append(restarted, g)
			}
		}
		j.endAttempt()
		j.gen, j.shape, j.begun = w.gen, shapeOf(w), true
		j.end, j.planned = make(chan struct{}), make(chan struct{})
	}
	planned := j.planned
	if j.linger != nil {
		j.linger.Stop()
		j.linger = nil
	}
	j.peers[p.ID] = peer{pid: p.PID, worker: w}
	j.setMonitored()
	gen := j.gen
	j.mu.Unlock()
	// A later restart count is the launcher's restart after a fault (a
	// rescale keeps the count), which ddp_restarts_total counts as it
	// does under ddp-agent run: one per generation that ended so.
	for _, g := range restarted {
		j.obs.Exp.Fault(g, fmt.Sprintf("the launcher restarted the job (its restart count went from %d to %d)", g, g+1), true)
	}
	if fresh {
		j.plan(w, planned)
	}
	if w.rank == 0 && w.nnodes() > 1 {
		select {
		case <-planned:
		case <-time.After(relayWelcomeWait):
			j.sc.log.Warn("rank 0's Welcome without the relay endpoint: the plan takes long", "job", j.id)
		}
	}
	return wire.Welcome{JobID: j.id, Generation: gen, WorldSize: int32(w.world), Rank: int32(w.rank),
		Config: map[string]string{wire.WelcomeRelay: j.kv.published()}}, nil
}

// endAttempt ends the attempt watched, if any (j.mu held; the watch's
// lock is taken after j.mu, never before).
func (j *job) endAttempt() {
	if !j.begun {
		return
	}
	j.watch.End()
	close(j.end)
	j.begun = false
}

// plan begins w's attempt in the watch and closes planned. Plans run one
// at a time; one overtaken by a newer attempt meanwhile is ended again.
func (j *job) plan(w worker, planned chan struct{}) {
	defer close(planned)
	j.planMu.Lock()
	defer j.planMu.Unlock()
	current := func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.begun && j.gen == w.gen && j.planned == planned && !j.closed
	}
	if !current() {
		return
	}
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
	j.mu.Lock()
	end := j.end
	j.mu.Unlock()
	j.watch.Begin(j.ctx, watch.Attempt{Gen: w.gen, GroupRank: w.groupRank, NNodes: w.nnodes(), WorldSize: w.world,
		RankOffset: w.offset(), MasterAddr: masterAddr, Done: end, Workers: workers, StackDir: w.stackDir,
		KV: kv, JobID: j.id})
	if !current() { // a newer attempt, or the job's close, came meanwhile: it ended the watch before this began
		j.watch.End()
	}
}

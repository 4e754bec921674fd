package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// The job's store: the TCPStore at MASTER_ADDR:MASTER_PORT through which
// the workers make their process group. Without Spec.AgentStore, rank 0's
// worker serves it (TORCHELASTIC_USE_AGENT_STORE=False, as with plain
// env://), and it dies with rank 0. With it, the group of node rank 0
// starts StoreArgv (python -m ddp_agent._store) before its workers, and
// every worker of the job is a client (TORCHELASTIC_USE_AGENT_STORE=True):
// the store outlives any worker, so the survivors of rank 0's death can
// re-form through it with a warm spare in rank 0's place. One store per
// attempt, ended with it, as torchrun 2.x's workers expect of an agent's.

// StoreExitError is the store's process exiting while the attempt's
// workers needed it: every worker's next use of the store fails, so the
// attempt must end.
type StoreExitError struct {
	PID        int
	Exit       string   // how it ended: "exit status 1", "signal: killed"
	StderrTail []string // its last words
	Time       time.Time
}

func (e *StoreExitError) Error() string {
	return fmt.Sprintf("the job's store (pid %d, serving MASTER_PORT) exited: %s", e.PID, e.Exit)
}

// hostsStore reports whether this group starts the job's store.
func (s *Spec) hostsStore() bool { return s.AgentStore && s.NodeRank == 0 }

// startStore starts the store's process, before the workers, so that it
// listens by the time they connect (their clients retry until it does).
func (g *Group) startStore() error {
	spec := g.spec
	if len(spec.StoreArgv) == 0 {
		return errors.New("start the job's store: no command (StoreArgv)")
	}
	var streams Streams
	if spec.Streams != nil {
		streams = spec.Streams(0) // where the node's output goes
	}
	w, err := g.spawn(launch{id: Worker{LocalRank: -1, Rank: -1}, dir: "store", streams: streams, prefix: "[store]:",
		argv: spec.StoreArgv, store: true,
		env: func(errorFile, noteFile string) []string {
			return append(rankless(workerEnv(spec.BaseEnv, spec, Worker{}, errorFile, noteFile, nil)), spec.SpareEnv...)
		}})
	if err != nil {
		return fmt.Errorf("start the job's store: %w", err)
	}
	g.mu.Lock()
	g.store = w
	g.mu.Unlock()
	g.log.Info("job store started", "pid", w.pid, "port", spec.MasterPort)
	return nil
}

// ServeStore starts the job's store for a group that carries on into a
// generation where it hosts it (Renumber into node rank 0, AgentStore)
// and does not serve it yet: the node that served the last generation's
// was lost, and the workers move to this one (agent/keep.go). An idle
// warm spare serves it where there is one (storeFromSpare), else a new
// process. It reports whether it started one, and whether a spare became
// it (the caller starts another when it sees fit, as after Replace).
// Call it between Waits, from Wait's goroutine.
func (g *Group) ServeStore() (started, spareUsed bool, err error) {
	g.mu.Lock()
	serving, hosts := g.store != nil, g.spec.hostsStore()
	g.mu.Unlock()
	if serving || !hosts {
		return false, false, nil
	}
	if pid, err := g.storeFromSpare(); err == nil {
		g.log.Info("job store started", "pid", pid, "port", g.spec.MasterPort, "from_spare", true)
		return true, true, nil
	} else if !errors.Is(err, ErrNoSpare) {
		g.log.Warn("a warm spare could not serve the job's store; starting a new process", "err", err)
	}
	if err := g.startStore(); err != nil {
		return false, false, err
	}
	return true, false, nil
}

// StoreAssignment is what a warm spare reads, as {"store": ...}, when it
// serves the job's store instead of taking a rank.
type StoreAssignment struct {
	Addr string `json:"addr"`
	Port int    `json:"port"`
}

// storeFromSpare has an idle warm spare serve the job's store: it has
// imported torch already, where a new process would first (1 s on the
// idle 2-core VM, 6-8 s beside four re-forming workers) while every
// worker of the job waits for the store. One JSON line on its pipe, as
// for a rank (ddp_agent._spare); returns its pid.
func (g *Group) storeFromSpare() (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.spares) == 0 {
		return 0, ErrNoSpare
	}
	sp := g.spares[0]
	g.spares = g.spares[1:]
	line, _ := json.Marshal(struct {
		Store StoreAssignment `json:"store"`
	}{StoreAssignment{Addr: g.spec.MasterAddr, Port: g.spec.MasterPort}}) // strings and ints: cannot fail
	prefix := []byte("[store]:") // as startStore's
	sp.stdout.setPrefix(prefix)
	sp.stderr.setPrefix(prefix)
	_, err := sp.spare.pipe.Write(append(line, '\n'))
	sp.spare.pipe.Close()
	sp.spare.pipe = nil
	if err != nil { // it died meanwhile; its exit is dropped as an idle spare's
		return 0, fmt.Errorf("spare %d (pid %d): %w", sp.spare.n, sp.pid, err)
	}
	sp.spare.assigned = true
	sp.store = true // its exit is the store's from now on (exited)
	g.store = sp
	return sp.pid, nil
}

// storeExited routes the store's exit: to Wait while the attempt runs, as
// a fault of its own; nowhere once it is over (Stop, success).
func (g *Group) storeExited(w *worker) {
	switch g.State() {
	case StateStopped, StateSucceeded, StateFailed:
		return
	}
	g.exits <- exit{w}
}

func (g *Group) storeExitError(w *worker) *StoreExitError {
	waitTimeout(&w.streamsDone, time.Second)
	e := &StoreExitError{PID: w.pid, Exit: "unknown", StderrTail: w.stderr.lastLines(), Time: w.exitedAt}
	if w.state != nil {
		e.Exit = w.state.String()
	}
	return e
}

// stopStore ends the store once every worker has succeeded: it holds
// nothing worth a grace period.
func (g *Group) stopStore() {
	g.mu.Lock()
	w := g.store
	g.mu.Unlock()
	if w == nil {
		return
	}
	if err := g.signal(w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		g.log.Warn("stop the job's store", "pid", w.pid, "err", err)
	}
}

// rankless is a worker's environment without the variables of a rank
// (nor the joining worker's mark: a spare waits for its rank).
func rankless(env []string) []string {
	return slices.DeleteFunc(env, func(kv string) bool {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "RANK", "LOCAL_RANK", "ROLE_RANK", envname.Join:
			return true
		}
		return false
	})
}

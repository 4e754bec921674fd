package supervisor

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"syscall"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// A warm spare is a process started beside the workers (Spec.Spares) that
// has paid what a new worker pays before it can train (the interpreter,
// importing torch and the script's modules) and then waits on its fd 3.
// When a worker dies, Replace gives the spare that worker's rank: one JSON
// line on the pipe, the variables that make it that rank. The survivors
// keep their processes; ddp_agent.InProcess has them re-form with the
// spare, which takes the model's state from a healthy peer
// (docs/in-process.md). Closing the pipe without a line tells an idle
// spare it is not needed, and it exits 0.

// maxReplacements bounds the spares one attempt gives ranks to: past it a
// worker's death restarts the job, as without spares (the survivors'
// InProcess gives up on its own after its max_reforms).
const maxReplacements = 16

// ErrNoSpare is Replace's error when no warm spare is idle.
var ErrNoSpare = errors.New("no warm spare is idle")

// spare is what a warm spare has beyond a worker.
type spare struct {
	n        int      // its number in the attempt: spare0, spare1, ...
	pipe     *os.File // the write end of its assignment pipe; nil once written or released
	assigned bool     // it took a rank (under Group.mu)
	warm     bool     // StartWarm's: Start makes it a worker (under Group.mu)
}

// Assignment is the line a spare reads when it takes a rank: the
// variables to set before the training script runs, and how the script
// runs (Mode).
type Assignment struct {
	Rank      int               `json:"rank"`
	LocalRank int               `json:"local_rank"`
	Env       map[string]string `json:"env"`
	// Mode: "" takes a dead worker's rank in the survivors' re-formation
	// (Replace); "start" and "join" are a worker started warm (StartWarm),
	// which starts the job's script as torchrun would, or joins the
	// re-formation of workers carried on from the last generation
	// (Spec.Join).
	Mode string `json:"mode,omitempty"`
}

// AddSpare starts one more warm spare, unless the attempt is over (its
// workers all succeeded, or Stop). A spare that cannot start is logged,
// not fatal: the job runs on without it. Safe to call from any goroutine.
func (g *Group) AddSpare() {
	g.spawnMu.Lock()
	defer g.spawnMu.Unlock()
	if !g.closed {
		g.startSpare()
	}
}

// Closed is closed when the attempt is over for spares.
func (g *Group) Closed() <-chan struct{} { return g.closedCh }

func (g *Group) startSpare() { g.startSpareReady(nil) }

// startSpareReady starts a spare; with ready, the write end of a pipe that
// becomes its fd 4 (StartWarm), on which it says its imports are done.
func (g *Group) startSpareReady(ready *os.File) *worker {
	g.mu.Lock()
	n := g.spareSeq
	g.spareSeq++
	g.mu.Unlock()
	r, wp, err := os.Pipe()
	if err != nil {
		g.log.Warn("warm spare not started", "spare", n, "err", err)
		return nil
	}
	spec := g.spec
	var streams Streams
	if spec.Streams != nil {
		streams = spec.Streams(0) // where the job's output goes; it is no rank's yet
	}
	w, err := g.spawn(launch{id: Worker{LocalRank: -1, Rank: -1}, dir: "spare_" + strconv.Itoa(n), streams: streams,
		prefix: "[spare" + strconv.Itoa(n) + "]:", argv: spec.SpareArgv, assign: r, ready: ready, spare: &spare{n: n, pipe: wp},
		env: func(errorFile, noteFile string) []string {
			env := spareEnv(spec, errorFile, noteFile)
			if ready != nil {
				env = append(env, envname.SpareReadyFD+"=4")
			}
			return env
		}})
	r.Close() // the child has its copy
	if err != nil {
		wp.Close()
		g.log.Warn("warm spare not started", "spare", n, "err", err)
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-w.done: // gone already: exited said so
		wp.Close()
		return nil
	default:
	}
	g.spares = append(g.spares, w)
	g.log.Info("warm spare started", "spare", n, "pid", w.pid)
	return w
}

// spareEnv is a spare's environment: a worker's without the variables of
// a rank (the assignment brings them), with the pipe's fd and SpareEnv.
func spareEnv(s *Spec, errorFile, noteFile string) []string {
	env := rankless(workerEnv(s.BaseEnv, s, Worker{}, errorFile, noteFile, nil))
	return append(append(env, envname.SpareFD+"=3"), s.SpareEnv...)
}

// Replace gives the rank of the worker that Wait just reported failed to
// an idle warm spare (AddSpare starts another, when the caller sees fit:
// a spare importing torch beside the re-forming workers slows them). It returns
// the spare's pid. The dead worker's outcome is kept out of Outcomes and
// PIDs from now on, but for the rank's exit while the spare is pending
// (Settled). Call it from Wait's goroutine, between Waits.
func (g *Group) Replace(rank int) (int, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	i := slices.IndexFunc(g.workers, func(w *worker) bool { return w.Rank == rank })
	switch {
	case i < 0:
		return 0, fmt.Errorf("replace rank %d: not a worker of this group", rank)
	case g.state != StateUnhealthy:
		return 0, fmt.Errorf("replace rank %d: the group is %v", rank, g.state)
	case len(g.replaced) >= maxReplacements:
		return 0, fmt.Errorf("replace rank %d: %d workers replaced already", rank, len(g.replaced))
	case len(g.spares) == 0:
		return 0, ErrNoSpare
	}
	dead, sp := g.workers[i], g.spares[0]
	select {
	case <-dead.done:
	default:
		return 0, fmt.Errorf("replace rank %d: its worker (pid %d) is still running", rank, dead.pid)
	}
	g.spares = g.spares[1:]
	if err := g.give(sp, dead.Worker, ""); err != nil { // it died meanwhile; its exit is dropped as an idle spare's
		return 0, fmt.Errorf("replace rank %d: %w", rank, err)
	}
	g.workers[i] = sp
	g.replaced = append(g.replaced, dead)
	g.pending = append(g.pending, dead)
	g.state = StateHealthy
	return sp.pid, nil
}

// Settled says that the spare that took the rank of the dead worker of
// pid dead took it: the others re-formed with it. Until then, Outcomes
// gives that rank the dead worker's exit (WorkerExitError.SparePID). A
// group that is failing (a worker exited since) or closed stays as it
// is: its root cause may have been decided on that exit already.
func (g *Group) Settled(dead int) {
	select {
	case <-g.closedCh: // g.closed is spawnMu's
		return
	default:
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != StateHealthy {
		return
	}
	g.pending = slices.DeleteFunc(g.pending, func(w *worker) bool { return w.pid == dead })
}

// give writes spare sp's assignment, rank id in mode (Assignment.Mode),
// and makes it that rank's worker; an error means it died meanwhile. The
// caller holds g.mu and has taken sp out of g.spares.
func (g *Group) give(sp *worker, id Worker, mode string) error {
	a := Assignment{Rank: id.Rank, LocalRank: id.LocalRank, Env: worldEnv(g.spec), Mode: mode}
	a.Env["RANK"], a.Env["LOCAL_RANK"], a.Env["ROLE_RANK"] = strconv.Itoa(id.Rank), strconv.Itoa(id.LocalRank), strconv.Itoa(id.Rank)
	a.Env["TORCHELASTIC_USE_AGENT_STORE"] = pyBool(g.spec.AgentStore) // a warm start's spec was provisional
	if g.spec.VirtualLocalRank {
		a.Env["LOCAL_RANK"] = "0"
	}
	if g.spec.Place != nil {
		// Its GPU's variables; a binding prefix cannot bind a process
		// that runs already, so a spare keeps the CPUs it started on.
		maps.Copy(a.Env, g.spec.Place(id.LocalRank).Env)
	}
	var streams Streams
	if g.spec.Streams != nil {
		streams = g.spec.Streams(id.LocalRank)
	}
	// Before the line: what it prints as the rank shows as the rank's.
	prefix := []byte(RenderPrefix(streams.Prefix, g.spec.Role, id))
	sp.stdout.setPrefix(prefix)
	sp.stderr.setPrefix(prefix)
	line, _ := json.Marshal(a) // a map of strings and ints: cannot fail
	_, err := sp.spare.pipe.Write(append(line, '\n'))
	sp.spare.pipe.Close()
	sp.spare.pipe = nil
	if err != nil {
		return fmt.Errorf("assign spare %d (pid %d): %w", sp.spare.n, sp.pid, err)
	}
	sp.Worker = id
	sp.spare.assigned = true
	return nil
}

// releaseSpares ends the idle spares: the attempt is over. Each has its
// pipe closed (which alone would end it, once its imports are done) and
// is killed with its children: it holds no state worth a grace period.
func (g *Group) releaseSpares() {
	g.spawnMu.Lock()
	defer g.spawnMu.Unlock()
	if !g.closed {
		g.closed = true
		close(g.closedCh)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, w := range g.spares {
		if w.spare.pipe != nil {
			w.spare.pipe.Close()
			w.spare.pipe = nil
		}
		if err := g.signal(w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			g.log.Warn("stop warm spare", "spare", w.spare.n, "pid", w.pid, "err", err)
		}
	}
}

// Spares returns how many warm spares are idle.
func (g *Group) Spares() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.spares)
}

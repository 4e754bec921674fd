// Package supervisor runs one node's worker processes: it spawns them with
// torchrun's environment, streams their output, notices the first exit at
// once (each worker has a goroutine blocked in wait, no polling), and stops
// the rest: SIGTERM to each worker's process group, a grace period, then
// SIGKILL. A worker that survives SIGKILL (stuck in uninterruptible sleep) is
// reported and abandoned, never waited for.
//
// A Group is one attempt; restarting means stopping a Group and starting a
// new one. The restart policy lives in the agent.
package supervisor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// State is the state of a worker group, as in torchelastic's WorkerState.
type State int

const (
	StateInit      State = iota // not started yet
	StateHealthy                // all workers running, or some already succeeded
	StateUnhealthy              // a worker failed; the group is being stopped
	StateSucceeded              // every worker exited 0
	StateFailed                 // a worker failed and the group has stopped
	StateStopped                // stopped from outside (signal or restart)
)

func (s State) String() string {
	return [...]string{"init", "healthy", "unhealthy", "succeeded", "failed", "stopped"}[s]
}

// Streams says where one worker's output goes.
type Streams struct {
	ConsoleOut, ConsoleErr bool // show on the agent's stdout/stderr, prefixed
	FileOut, FileErr       bool // write to stdout.log/stderr.log in the worker's log dir
	// Prefix is the console lines' prefix, torchrun's template with the
	// macros ${role_name}, ${local_rank}, ${rank} and ${hostname}; "" is
	// DefaultPrefix.
	Prefix string
	// DupOut and DupErr: the lines of stdout (stderr) that hold one of
	// these strings are also appended, prefixed, to the attempt's
	// filtered_stdout.log (filtered_stderr.log), shared by every rank
	// (torchrun's --duplicate-stdout-filters).
	DupOut, DupErr []string
}

// Spec is everything needed to start one attempt of the local workers.
type Spec struct {
	Argv    []string
	BaseEnv []string // usually os.Environ()

	NProc      int // workers on this node
	RankOffset int // global rank of local rank 0
	WorldSize  int
	NodeRank   int
	NNodes     int

	MasterAddr    string
	MasterPort    int
	RunID         string
	Role          string
	RestartCount  int
	MaxRestarts   int
	Generation    uint64
	ControlSocket string
	// Bootstrap, when set, is DDP_AGENT_BOOTSTRAP: "external" tells the
	// workers' hook that the agent's store is node-local, so the job's
	// communicators must bootstrap through torch's store.
	Bootstrap string
	// TorchVersion is the workers' PyTorch ("2.11.0+cu130"; "" unknown):
	// it picks the name of the NCCL error-handling variable they read.
	TorchVersion string
	// SignalsToHandle is TORCHELASTIC_SIGNALS_TO_HANDLE, the signals the
	// launcher stops on (--signals-to-handle), as torchrun 2.x tells its
	// workers; "" is torchrun's default.
	SignalsToHandle string

	// VirtualLocalRank: every worker's LOCAL_RANK is 0 (torchrun's
	// --virtual-local-rank; Place gives each its own GPU alone).
	VirtualLocalRank bool

	// Place, when set, says where each local rank runs: an argv prefix
	// that binds it (ddp-agent's NUMA binding trampoline) and variables
	// that name its GPUs. Nil: every worker runs Argv as it is.
	Place func(localRank int) Placement

	// AttemptDir holds <local_rank>/error.json (TORCHELASTIC_ERROR_FILE) and,
	// when Streams asks for it, <local_rank>/stdout.log and stderr.log.
	AttemptDir string
	Streams    func(localRank int) Streams
	Stdout     *Console
	Stderr     *Console
	// OnLogLoss, when set, is told of every log file that misses output
	// because writes to it failed, once the worker's stream has ended;
	// the first failure is logged at once either way.
	OnLogLoss func(LogLoss)

	// Spares is how many warm spares run beside the workers (spare.go):
	// processes of SpareArgv that start, import what they can, and wait
	// on their fd 3 to take a dead worker's rank (Replace). SpareEnv is
	// added to their environment.
	Spares    int
	SpareArgv []string
	SpareEnv  []string

	// AgentStore: the job's store is served by a process of its own
	// (store.go), StoreArgv, which the group of node rank 0 starts; every
	// worker is its client. False: rank 0's worker serves it. SpareEnv is
	// added to the store's environment too.
	AgentStore bool
	StoreArgv  []string

	// WorldFile, when set, is DDP_AGENT_WORLD_FILE: where the agent
	// writes the world that the workers carry on into after a node was
	// lost (Renumber; ddp_agent.InProcess reads it).
	WorldFile string
	// Join: the workers start to join the re-formation in process of
	// workers that carry on from the last generation (another node's,
	// renumbered), instead of starting a job: each runs SpareArgv as a
	// spare given its rank at once (DDP_AGENT_JOIN).
	Join bool
}

// Placement is where one worker runs.
type Placement struct {
	// Prefix goes before Argv: a command that sets the worker's CPU and
	// memory binding and then execs the rest.
	Prefix []string
	// Env is added to the worker's environment, over the agent's own
	// (CUDA_VISIBLE_DEVICES, ...), under torchrun's variables.
	Env map[string]string
}

// WorkerExitError is a worker that exited with a non-zero code or was
// killed by a signal: the root cause of a failed attempt.
type WorkerExitError struct {
	Rank, LocalRank, PID int
	Code                 int            // exit code, or -1 when killed by a signal
	Signal               syscall.Signal // 0 unless killed by a signal
	StderrTail           []string       // last lines of its stderr
	ErrorFile            *ErrorFile     // what it wrote to TORCHELASTIC_ERROR_FILE, if anything
	Time                 time.Time      // when it was reaped
	// SparePID, in Outcomes, is the warm spare that took the rank of this
	// dead worker (Replace) and that the others have not re-formed with
	// yet (Settled): the attempt failed with the spare still in its place.
	SparePID int
}

// Failed reports whether the worker failed: a code other than 0, or a signal.
func (e *WorkerExitError) Failed() bool { return e.Code != 0 || e.Signal != 0 }

func (e *WorkerExitError) Error() string {
	if e.Signal != 0 {
		return fmt.Sprintf("worker rank %d (local rank %d, pid %d) killed by signal %d (%s)", e.Rank, e.LocalRank, e.PID, int(e.Signal), e.Signal)
	}
	return fmt.Sprintf("worker rank %d (local rank %d, pid %d) exited with code %d", e.Rank, e.LocalRank, e.PID, e.Code)
}

type worker struct {
	Worker
	pid         int
	errorFile   string
	noteFile    string // DDP_AGENT_COMM_NOTE_FILE
	stdout      *stream
	stderr      *stream
	streamsDone sync.WaitGroup
	readers     []*os.File
	done        chan struct{} // closed when the process has been reaped
	state       *os.ProcessState
	exitedAt    time.Time // when it was reaped; set before done is closed
	spare       *spare    // set for a warm spare, assigned or not
	store       bool      // the job's store's process (store.go)

	exitOnce sync.Once
	exitErr  *WorkerExitError // its exit, once reaped (exitError)
}

// exit is sent by a worker's wait goroutine.
type exit struct{ w *worker }

// Group is one attempt of the local workers. Start, Wait and Stop must be
// called from one goroutine; State, PIDs, RankOf and Raising are safe
// concurrently.
type Group struct {
	spec   *Spec
	log    *slog.Logger
	exits  chan exit // one value per worker, sent when it is reaped
	reaped int       // values received from exits, by Wait

	mu      sync.Mutex
	state   State
	workers []*worker // one per local rank, appended by Start; Replace swaps one for a spare
	// spares wait to be assigned; replaced are the dead workers whose
	// ranks spares took, in order (spare.go); pending are those of them
	// whose spares the others have not re-formed with yet (Settled).
	spares, replaced, pending []*worker
	spareSeq                  int     // spares started so far: the next one's number
	store                     *worker // the job's store's process, when this group hosts it

	// spawnMu orders starting a spare against the attempt's end: once
	// closed (releaseSpares), no spare starts, and closedCh is closed.
	spawnMu  sync.Mutex
	closed   bool
	closedCh chan struct{}

	// signal is how Stop signals a process group; a field so tests can
	// simulate a process that ignores even SIGKILL (uninterruptible sleep).
	signal func(pgid int, sig syscall.Signal) error
	// reapWait bounds how long Stop waits for a SIGKILLed worker to be reaped.
	reapWait time.Duration
	// lingerWarn is how long after a worker's success Wait warns about the
	// ones still running.
	lingerWarn time.Duration
}

// New returns a group for spec without starting it, so its RankOf can be
// published (to the control socket) before the first worker runs.
func New(spec *Spec, log *slog.Logger) *Group {
	return &Group{
		spec:       spec,
		log:        log,
		exits:      make(chan exit, spec.NProc+maxReplacements+1), // never blocks a wait goroutine (+1: the store)
		closedCh:   make(chan struct{}),
		state:      StateInit,
		signal:     func(pgid int, sig syscall.Signal) error { return syscall.Kill(-pgid, sig) },
		reapWait:   3 * time.Second,
		lingerWarn: 30 * time.Second,
	}
}

// Start spawns the workers. Each worker leads its own process group (so a
// signal reaches its children too) and is SIGKILLed by the kernel if the
// agent dies (Pdeathsig). If any worker cannot be started, the ones already
// started are stopped and the error returned.
//
// ctx is checked before every worker, so a signal stops the spawning of a
// large group at once: Start then returns an error wrapping ctx's cause,
// with the workers started so far still running, for the caller to stop
// as it stops a running group (its signal, its grace period).
func (g *Group) Start(ctx context.Context) error {
	if g.spec.hostsStore() {
		if err := g.startStore(); err != nil {
			return err
		}
	}
	for lr := 0; lr < g.spec.NProc; lr++ {
		if ctx.Err() != nil {
			cause := context.Cause(ctx)
			g.log.Info("spawning stopped", "started", lr, "nproc", g.spec.NProc, "reason", cause)
			g.setState(StateHealthy) // what runs is stopped as a running group is
			return fmt.Errorf("started %d of %d workers: %w", lr, g.spec.NProc, cause)
		}
		id := Worker{LocalRank: lr, Rank: g.spec.RankOffset + lr}
		if w := g.startFromWarm(id); w != nil { // StartWarm's
			g.mu.Lock()
			g.workers = append(g.workers, w)
			g.mu.Unlock()
			continue
		}
		w, err := g.startWorker(id)
		if err != nil {
			g.Stop(syscall.SIGTERM, time.Second)
			return fmt.Errorf("start worker local rank %d: %w", lr, err)
		}
		g.mu.Lock()
		g.workers = append(g.workers, w)
		g.mu.Unlock()
	}
	g.setState(StateHealthy)
	for range g.spec.Spares {
		g.AddSpare()
	}
	return nil
}

// exited routes a reaped process: a worker's exit (a spare's, once it
// took a rank) to Wait; an idle spare's is dropped here.
func (g *Group) exited(w *worker) {
	g.mu.Lock()
	store := w.store // a spare's once it serves the store (storeFromSpare)
	g.mu.Unlock()
	if store {
		g.storeExited(w)
		return
	}
	g.mu.Lock()
	idle := w.spare != nil && !w.spare.assigned
	if idle {
		g.spares = slices.DeleteFunc(g.spares, func(s *worker) bool { return s == w })
	}
	st := g.state
	g.mu.Unlock()
	if !idle {
		g.exits <- exit{w}
		return
	}
	if st == StateHealthy {
		waitTimeout(&w.streamsDone, time.Second) // its last words, as a worker's report has them
		g.log.Warn("warm spare exited before it was needed", "spare", w.spare.n, "pid", w.pid, "exit", w.state.String(),
			"stderr", w.stderr.lastLines())
	}
}

func (g *Group) startWorker(id Worker) (*worker, error) {
	spec := g.spec
	var streams Streams
	if spec.Streams != nil {
		streams = spec.Streams(id.LocalRank)
	}
	var place Placement
	if spec.Place != nil {
		place = spec.Place(id.LocalRank)
	}
	argv, extra := spec.Argv, []string(nil)
	if spec.Join { // a spare's command and environment (the package's path)
		argv, extra = spec.SpareArgv, spec.SpareEnv
	}
	return g.spawn(launch{id: id, dir: strconv.Itoa(id.LocalRank), streams: streams,
		prefix: RenderPrefix(streams.Prefix, spec.Role, id), argv: argv, place: place,
		env: func(errorFile, noteFile string) []string {
			return append(workerEnv(spec.BaseEnv, spec, id, errorFile, noteFile, place.Env), extra...)
		}})
}

// launch is how spawn starts one process of the group: a worker, or a
// warm spare (spare.go).
type launch struct {
	id      Worker
	dir     string // under AttemptDir: its error file, note file and logs
	streams Streams
	prefix  string // of its console lines
	argv    []string
	place   Placement
	env     func(errorFile, noteFile string) []string
	assign  *os.File // the read end of a spare's assignment pipe (its fd 3); nil for a worker
	ready   *os.File // the write end of a warm start's ready pipe (its fd 4; StartWarm); nil otherwise
	spare   *spare   // a spare's, set before its exit can be routed (exited)
	store   bool     // the job's store's process
}

func (g *Group) spawn(l launch) (*worker, error) {
	spec := g.spec
	id, streams := l.id, l.streams
	dir := filepath.Join(spec.AttemptDir, l.dir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create worker dir: %w", err)
	}
	w := &worker{Worker: id, errorFile: filepath.Join(dir, "error.json"), noteFile: filepath.Join(dir, "comm_note.json"),
		done: make(chan struct{}), spare: l.spare, store: l.store}
	prefix := []byte(l.prefix)
	w.stdout = newStream(prefix, false)
	w.stderr = newStream(prefix, true) // its last lines go into the failure report
	if streams.ConsoleOut {
		w.stdout.console = spec.Stdout
	}
	if streams.ConsoleErr {
		w.stderr.console = spec.Stderr
	}
	var err error
	if w.stdout.dup, err = openDup(spec.AttemptDir, "filtered_stdout.log", streams.DupOut); err != nil {
		return nil, err
	}
	w.stdout.filters = bytesOf(streams.DupOut)
	if w.stderr.dup, err = openDup(spec.AttemptDir, "filtered_stderr.log", streams.DupErr); err != nil {
		w.closeFiles()
		return nil, err
	}
	w.stderr.filters = bytesOf(streams.DupErr)
	if streams.FileOut {
		if w.stdout.file, err = g.openLog(dir, "stdout.log", id.Rank); err != nil {
			w.closeFiles()
			return nil, err
		}
	}
	if streams.FileErr {
		if w.stderr.file, err = g.openLog(dir, "stderr.log", id.Rank); err != nil {
			w.closeFiles()
			return nil, err
		}
	}
	// Our own pipes, not exec's: exec would make Wait block until every
	// holder of the pipe (a worker's own children, too) has exited.
	outR, outW, err := os.Pipe()
	if err != nil {
		w.closeFiles()
		return nil, fmt.Errorf("stdout pipe: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		w.closeFiles()
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("stderr pipe: %w", err)
	}
	place, argv := l.place, l.argv
	if len(place.Prefix) > 0 {
		// The prefix execs the command later, in the child: a command that
		// does not exist must still fail here, as it does without one.
		if _, err := exec.LookPath(argv[0]); err != nil {
			w.closeFiles()
			outR.Close()
			outW.Close()
			errR.Close()
			errW.Close()
			return nil, fmt.Errorf("resolve worker command %q: %w", argv[0], err)
		}
		argv = append(slices.Clone(place.Prefix), argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = l.env(w.errorFile, w.noteFile)
	cmd.Stdout, cmd.Stderr = outW, errW
	if l.assign != nil {
		cmd.ExtraFiles = []*os.File{l.assign} // fd 3
	}
	if l.ready != nil {
		cmd.ExtraFiles = append(cmd.ExtraFiles, l.ready) // fd 4
	}
	// Pdeathsig fires when the thread that forked the child exits; the Go
	// runtime only ends threads whose goroutine locked them and exited, and
	// the agent never spawns from such a goroutine.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		w.closeFiles()
		outR.Close()
		errR.Close()
		return nil, err
	}
	w.pid = cmd.Process.Pid
	w.readers = []*os.File{outR, errR}
	w.streamsDone.Add(2)
	go func() { defer w.streamsDone.Done(); w.stdout.copy(outR) }()
	go func() { defer w.streamsDone.Done(); w.stderr.copy(errR) }()
	go func() {
		_ = cmd.Wait() // the exit status is in ProcessState
		w.state = cmd.ProcessState
		w.exitedAt = time.Now()
		// Its children (DataLoader workers, shells) must not outlive it.
		// Right after the reap the group id cannot have been reused yet:
		// the kernel keeps a pid while any process uses it as a group id.
		_ = syscall.Kill(-w.pid, syscall.SIGKILL)
		close(w.done)
		g.exited(w)
	}()
	g.log.Debug("worker started", "rank", id.Rank, "local_rank", id.LocalRank, "pid", w.pid)
	return w, nil
}

// openLog creates a worker's log file name in dir.
func (g *Group) openLog(dir, name string, rank int) (*logFile, error) {
	path := filepath.Join(dir, name)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o644)
	if err != nil {
		return nil, fmt.Errorf("worker log file: %w", err)
	}
	return newLogFile(f, path, rank, g.log, g.spec.OnLogLoss), nil
}

// closeFiles closes the log files of a worker that did not start.
func (w *worker) closeFiles() {
	for _, f := range []*logFile{w.stdout.file, w.stderr.file} {
		if f != nil {
			f.w.Close()
		}
	}
	for _, f := range []*os.File{w.stdout.dup, w.stderr.dup} {
		if f != nil {
			f.Close()
		}
	}
}

// PIDs maps each worker's global rank to its pid.
func (g *Group) PIDs() map[int]int {
	g.mu.Lock() // Renumber writes the ranks
	defer g.mu.Unlock()
	m := map[int]int{}
	for _, w := range g.workers {
		m[w.Rank] = w.pid
	}
	return m
}

// State returns the group's current state.
func (g *Group) State() State {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state
}

func (g *Group) setState(s State) {
	g.mu.Lock()
	g.state = s
	g.mu.Unlock()
}

// Wait blocks until every worker has exited 0 (nil), one worker has failed
// (a *WorkerExitError, returned at once, with the others still running), or
// ctx is done (ctx's error). Call Stop after a non-nil result.
func (g *Group) Wait(ctx context.Context) error {
	g.mu.Lock()
	n := len(g.workers) + len(g.replaced) // a replaced worker was reaped, and counted, before its Replace
	g.mu.Unlock()
	// Once a worker has succeeded, the others should follow within moments;
	// one that does not is usually stuck at exit (a destructor, a thread
	// join), and nobody else will say so.
	var linger <-chan time.Time
	for g.reaped < n {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-linger:
			for _, w := range g.alive() {
				g.log.Warn("worker still running after others succeeded; stuck at exit? (py-spy dump --pid PID shows where)",
					"rank", w.Rank, "pid", w.pid, "state", procState(w.pid), "waited", g.lingerWarn)
			}
			linger = time.After(2 * g.lingerWarn)
		case e := <-g.exits:
			if e.w.store {
				g.setState(StateUnhealthy)
				return g.storeExitError(e.w)
			}
			g.reaped++
			if e.w.state != nil && e.w.state.Success() {
				g.log.Debug("worker succeeded", "rank", e.w.Rank, "pid", e.w.pid)
				if linger == nil {
					linger = time.After(g.lingerWarn)
				}
				continue
			}
			g.setState(StateUnhealthy)
			return g.exitError(e.w)
		}
	}
	g.setState(StateSucceeded)
	g.releaseSpares()
	g.stopStore()
	g.drainStreams(time.Second)
	return nil
}

// exitError is reaped worker w's exit (Code 0 when it succeeded), made
// once.
func (g *Group) exitError(w *worker) *WorkerExitError {
	w.exitOnce.Do(func() { w.exitErr = g.makeExitError(w) })
	return w.exitErr
}

func (g *Group) makeExitError(w *worker) *WorkerExitError {
	// Give its stderr a moment to reach EOF, so the tail holds its last words.
	waitTimeout(&w.streamsDone, time.Second)
	e := &WorkerExitError{Rank: w.Rank, LocalRank: w.LocalRank, PID: w.pid, Code: -1, StderrTail: w.stderr.lastLines(),
		Time: w.exitedAt}
	if w.state != nil {
		if ws, ok := w.state.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			e.Signal = ws.Signal()
		} else {
			e.Code = w.state.ExitCode()
		}
	}
	if ef, err := readErrorFile(w.errorFile); err == nil {
		e.ErrorFile = ef
	} else if !errors.Is(err, os.ErrNotExist) {
		g.log.Warn("unreadable worker error file", "rank", w.Rank, "path", w.errorFile, "err", err)
	}
	return e
}

// Outcome is what the supervisor knows of one worker when an attempt
// fails, for working out its root cause.
type Outcome struct {
	Rank, LocalRank, PID int
	Exit                 *WorkerExitError // nil while it runs; Code 0 when it succeeded
	Peer                 *PeerFailure     // its shim's note that a peer failed it, if any
	// Closed is when it first closed a communicator (its shim's note), zero
	// if it never did: its peers saw it go then, maybe long before its exit.
	Closed time.Time
	// Raised is when it wrote its error file (torchelastic's @record, as
	// its exception left main), zero if it has not: it was failing then,
	// though its exit may come seconds later (atexit handlers, its
	// interpreter's teardown), after its victims' exits. Without the hook
	// it is the only sign of who raised first.
	Raised time.Time
}

// Outcomes returns every worker's outcome so far, in local rank order. It
// reads files the workers write, and may wait up to a second for each
// reaped worker's stderr to end.
func (g *Group) Outcomes() []Outcome {
	var out []Outcome
	g.mu.Lock()
	pending := slices.Clone(g.pending)
	g.mu.Unlock()
	for _, w := range g.list() {
		o := Outcome{Rank: w.Rank, LocalRank: w.LocalRank, PID: w.pid}
		if i := slices.IndexFunc(pending, func(d *worker) bool { return d.Rank == w.Rank }); i >= 0 {
			// A spare took a dead worker's rank, and the others never
			// re-formed with it (a script without InProcess starts again
			// from its top, and its peers fail): the rank failed when its
			// worker died, not when the agent stopped the spare.
			dead := *g.exitError(pending[i])
			dead.SparePID = w.pid
			o.PID, o.Exit, w = dead.PID, &dead, pending[i]
		}
		select {
		case <-w.done:
			if o.Exit == nil {
				o.Exit = g.exitError(w)
			}
		default:
		}
		var err error
		if o.Closed, o.Peer, err = readCommNote(w.noteFile, g.spec.WorldSize); err != nil && !errors.Is(err, os.ErrNotExist) {
			g.log.Warn("unreadable communicator note", "rank", w.Rank, "path", w.noteFile, "err", err)
		}
		o.Raised = w.raised()
		out = append(out, o)
	}
	return out
}

// WaitExited waits until the worker of global rank has been reaped, ctx
// is done, or d has passed; it reports whether the worker was reaped.
func (g *Group) WaitExited(ctx context.Context, rank int, d time.Duration) bool {
	for _, w := range g.list() {
		if w.Rank != rank {
			continue
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-w.done:
			return true
		case <-ctx.Done():
		case <-t.C:
		}
		return false
	}
	return false
}

// Stop stops every worker still running: sig (SIGTERM, or SIGINT to let
// Python raise KeyboardInterrupt) to its process group, then SIGKILL to the
// groups still alive after grace. It returns once every worker is reaped,
// or after a bounded wait past SIGKILL for any that cannot be
// (uninterruptible sleep); those are logged, abandoned and returned.
func (g *Group) Stop(sig syscall.Signal, grace time.Duration) (abandoned []int) {
	if st := g.State(); st == StateHealthy || st == StateInit {
		g.setState(StateStopped)
	} else if st == StateUnhealthy {
		g.setState(StateFailed)
	}
	g.releaseSpares()
	alive := g.aliveAll()
	for _, w := range alive {
		if err := g.signal(w.pid, sig); err != nil && !errors.Is(err, syscall.ESRCH) {
			g.log.Warn("signal worker", "signal", sig, "rank", w.Rank, "pid", w.pid, "err", err)
		}
	}
	if !g.waitAll(alive, grace) {
		for _, w := range g.aliveAll() {
			g.log.Warn("worker did not stop within the grace period; sending SIGKILL", "rank", w.Rank, "pid", w.pid, "grace", grace)
			if err := g.signal(w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				g.log.Warn("SIGKILL worker", "rank", w.Rank, "pid", w.pid, "err", err)
			}
		}
		if !g.waitAll(alive, g.reapWait) {
			for _, w := range g.aliveAll() {
				g.log.Error("worker survived SIGKILL (uninterruptible sleep?); abandoning it", "rank", w.Rank, "pid", w.pid, "state", procState(w.pid))
				abandoned = append(abandoned, w.pid)
			}
		}
	}
	g.drainStreams(time.Second)
	return abandoned
}

// Kill sends SIGKILL to the process group of rank's worker, whose exit
// Wait then reports as any other (the agent kills a hung rank for a warm
// spare to take).
func (g *Group) Kill(rank int) error {
	for _, w := range g.list() {
		if w.Rank == rank {
			if err := g.signal(w.pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				return fmt.Errorf("kill rank %d (pid %d): %w", rank, w.pid, err)
			}
			return nil
		}
	}
	return fmt.Errorf("kill rank %d: not a worker of this group", rank)
}

// list returns the workers started so far.
func (g *Group) list() []*worker {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.workers) // Replace writes an element in place
}

// processes returns every process the group started: its workers, the
// ones they replaced, and its idle spares.
func (g *Group) processes() []*worker {
	g.mu.Lock()
	defer g.mu.Unlock()
	ps := slices.Concat(g.workers, g.replaced, g.spares)
	if g.store != nil {
		ps = append(ps, g.store)
	}
	return ps
}

// aliveAll returns the processes not reaped yet, spares included.
func (g *Group) aliveAll() []*worker { return running(g.processes()) }

func (g *Group) alive() []*worker { return running(g.list()) }

func running(ws []*worker) []*worker {
	var out []*worker
	for _, w := range ws {
		select {
		case <-w.done:
		default:
			out = append(out, w)
		}
	}
	return out
}

func (g *Group) waitAll(ws []*worker, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	for _, w := range ws {
		select {
		case <-w.done:
		case <-t.C:
			return false
		}
	}
	return true
}

// drainStreams waits up to d for worker output to reach EOF, then closes the
// pipes: a grandchild holding a pipe open must not keep a reader forever.
func (g *Group) drainStreams(d time.Duration) {
	deadline := time.Now().Add(d)
	workers := g.processes()
	for _, w := range workers {
		waitTimeout(&w.streamsDone, time.Until(deadline))
		for _, r := range w.readers {
			r.Close()
		}
	}
	for _, w := range workers {
		waitTimeout(&w.streamsDone, 100*time.Millisecond)
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

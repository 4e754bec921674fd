// Package guard makes every process an agent started, and every process
// those started, die with the agent, however it dies.
//
// A worker or plugin gets SIGKILL when the agent dies (PR_SET_PDEATHSIG),
// and the agent kills each worker's process group when it stops it. Both
// miss a descendant of a worker when the agent is SIGKILLed: the group
// kill runs in the agent, which is gone, and the parent-death signal
// reaches only the agent's own children. A subprocess.Popen, a shell, a
// data loader or tokenizer server, a multiprocessing pool, a daemon that
// called setsid: each survived under pid 1.
//
// So the agent starts a guard: a small process of its own (ddp-agent
// itself, in a session of its own, deaf to the job's signals) that holds
// the read end of a pipe whose write end only the agent holds. Every
// process the agent started inherits the agent's instance id
// (envname.Instance). An agent that ends cleanly kills what still carries
// it itself (Close) and tells the guard so; when the pipe reads EOF
// without that word the agent died, and the guard kills every process of
// the user's whose environment carries the id, until none is left. A
// process that empties its own environment escapes it; cgroups would not,
// but need privileges that an agent run by a user under Slurm does not
// have. Then it removes the temporary dirs the agent left (its run dir,
// its control socket's, its store's data and TLS files), which the
// agent's death unlocked (internal/tempdir).
package guard

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
	"github.com/ddp-agent/ddp-agent/internal/tempdir"
)

// Command is the hidden ddp-agent command that runs a guard: `ddp-agent
// <Command> <id>`.
const Command = "__guard"

// Guard is an agent's handle on its guard.
type Guard struct {
	ID string
	w  *os.File // the pipe's write end: closing it (or dying) tells the guard
}

// Start starts the guard of this agent, whose executable is self, and
// adds the agent's instance id to its environment, so that every process
// it starts from now on carries it. Call it before starting any.
func Start(self string, stderr *os.File) (*Guard, error) {
	b := make([]byte, 8)
	rand.Read(b)
	id := hex.EncodeToString(b)
	r, w, err := os.Pipe() // close-on-exec: no worker inherits the write end
	if err != nil {
		return nil, fmt.Errorf("start the guard: %w", err)
	}
	cmd := exec.Command(self, Command, id)
	cmd.Stdin = r
	if reportsTo(stderr) {
		cmd.Stderr = stderr
	}
	// A session of its own: a signal to the agent's process group (a
	// Ctrl-C, a launcher's group kill) leaves it to do its work.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("start the guard: %w", err)
	}
	g := &Guard{ID: id, w: w}
	go func() { _ = cmd.Wait() }() // reaped whenever it exits
	ids := id
	if prev := os.Getenv(envname.Instance); prev != "" {
		ids = prev + "," + id
	}
	os.Setenv(envname.Instance, ids)
	return g, nil
}

// reportsTo reports whether the guard may hold f, the agent's stderr, to
// say what it killed after the agent died: a terminal or a file, yes; a
// pipe, no, for its reader waits for every holder to close it (a
// launcher, a log shipper, a test's harness), and the guard, started
// with a race-instrumented binary on a loaded machine, once took a
// second to start and go.
func reportsTo(f *os.File) bool {
	if f == nil {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeNamedPipe == 0 && fi.Mode()&os.ModeSocket == 0
}

// Close is the agent's own end: it kills what is left that carries the
// agent's id (a setsid daemon of a worker: the workers themselves are
// stopped by then), in a few rounds, then lets the guard go without a
// sweep of its own. It returns the
// pids it killed, and an error naming those still there. An agent that
// dies without calling it has the guard sweep instead. It does not wait
// for the guard to exit: the guard may still be starting.
//
// Swept here, not by the guard: the guard holds the agent's stderr, and
// a caller waiting for that to close (a test's harness, a pipe into a
// log shipper) waited for the guard's sweep too, which on a loaded
// machine once took a second after a clean exit.
func (g *Guard) Close() ([]int, error) {
	if g == nil {
		return nil, nil
	}
	killed, err := sweep(g.ID, os.Getpid(), 10, 20*time.Millisecond)
	// The guard reads this and exits; nothing is left for the agent to
	// wait for.
	_, _ = g.w.Write([]byte{swept})
	g.w.Close()
	return killed, err
}

// swept is what a clean agent writes to its guard before it closes the
// pipe: it swept itself, and the guard exits at once.
const swept = 'q'

// Run is the guard: it waits for the agent to end (EOF, or an error, on
// agentPipe), then kills the processes that carry id. It returns the
// exit code.
func Run(id string, agentPipe io.Reader, stderr io.Writer) int {
	if !validID(id) {
		fmt.Fprintf(stderr, "ddp-agent %s: %q is not an instance id\n", Command, id)
		return 2
	}
	// The job's signals are the agent's to handle; the guard's job starts
	// when the agent is gone.
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	b := make([]byte, 1)
	if n, _ := agentPipe.Read(b); n == 1 && b[0] == swept {
		return 0
	}
	killed, err := sweep(id, os.Getpid(), 50, 20*time.Millisecond)
	if len(killed) > 0 {
		fmt.Fprintf(stderr, "ddp-agent: the agent is gone; its guard killed %d processes it had started, with what they started: pids %v\n", len(killed), killed)
	}
	removed, rerr := removeDirs()
	if len(removed) > 0 {
		fmt.Fprintf(stderr, "ddp-agent: the agent's guard removed the temporary dirs it left: %v\n", removed)
	}
	if err = errors.Join(err, rerr); err != nil {
		fmt.Fprintf(stderr, "ddp-agent: the agent's guard: %v\n", err)
		return 1
	}
	return 0
}

// removeDirs removes the temporary dirs of agents that are gone (this
// one's: its etcd data, the job's TLS key, its run dir, its control
// socket), after the processes that might write there are dead. The
// control socket's dir falls back to /tmp under a long TMPDIR.
func removeDirs() ([]string, error) {
	var removed []string
	var errs []error
	for _, parent := range slices.Compact([]string{os.TempDir(), "/tmp"}) {
		r, err := tempdir.RemoveStale(parent, tempdir.Kinds(), time.Now())
		removed = append(removed, r...)
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

func validID(id string) bool {
	b, err := hex.DecodeString(id)
	return err == nil && len(b) == 8
}

// leftError: processes that carry the id were still there after every
// round (one that exits slowly, or in uninterruptible sleep).
type leftError struct{ pids []int }

func (e *leftError) Error() string {
	return fmt.Sprintf("processes of the agent still there after the last round: pids %v", e.pids)
}

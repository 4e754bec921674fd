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
// the read end of a pipe whose write end only the agent holds. When the
// agent ends, however it ends, the pipe reads EOF and the guard kills
// every process of the user's whose environment carries the agent's
// instance id, which every process the agent started inherits
// (envname.Instance), until none is left. A process that empties its own
// environment escapes it; cgroups would not, but need privileges that an
// agent run by a user under Slurm does not have.
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
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// Command is the hidden ddp-agent command that runs a guard: `ddp-agent
// <Command> <id>`.
const Command = "__guard"

// Guard is an agent's handle on its guard.
type Guard struct {
	ID   string
	w    *os.File // the pipe's write end: closing it (or dying) tells the guard
	cmd  *exec.Cmd
	done chan struct{}
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
	cmd.Stdin, cmd.Stderr = r, stderr
	// A session of its own: a signal to the agent's process group (a
	// Ctrl-C, a launcher's group kill) leaves it to do its work.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err = cmd.Start()
	r.Close()
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("start the guard: %w", err)
	}
	g := &Guard{ID: id, w: w, cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(g.done)
	}()
	ids := id
	if prev := os.Getenv(envname.Instance); prev != "" {
		ids = prev + "," + id
	}
	os.Setenv(envname.Instance, ids)
	return g, nil
}

// Close tells the guard the agent is ending and waits, up to wait, for
// it to have killed what is left. An agent that dies without calling it
// tells the guard all the same.
func (g *Guard) Close(wait time.Duration) {
	if g == nil {
		return
	}
	g.w.Close()
	select {
	case <-g.done:
	case <-time.After(wait):
	}
}

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
	_, _ = io.Copy(io.Discard, agentPipe)
	killed, err := sweep(id, os.Getpid(), 50, 20*time.Millisecond)
	if len(killed) > 0 {
		fmt.Fprintf(stderr, "ddp-agent: the agent is gone; its guard killed %d processes it had started, with what they started: pids %v\n", len(killed), killed)
	}
	if err != nil {
		fmt.Fprintf(stderr, "ddp-agent: the agent's guard: %v\n", err)
		return 1
	}
	return 0
}

func validID(id string) bool {
	b, err := hex.DecodeString(id)
	return err == nil && len(b) == 8
}

// errLeft: processes that carry the id were still there after every round.
var errLeft = errors.New("processes of the agent still alive after the last round")

package exec

import (
	"context"
	"fmt"
	"io"
	"os"
	osexec "os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// messageLimit is how much of a check's output is kept: the message is its
// first line, and the rest is read and thrown away so the check never
// blocks on a full pipe.
const messageLimit = 1024

// pipeGrace is how long the output is waited for once the check and its
// process group are gone: only a process that left the group (setsid)
// can still hold the pipe.
const pipeGrace = 200 * time.Millisecond

// result is how one run of the command ended.
type result struct {
	exitCode int    // -1: killed by a signal, or never started
	signal   string // the signal that ended it, if one did
	timedOut bool
	startErr error
	output   string // the first messageLimit bytes of stdout
}

// run runs command once through /bin/sh -c in a process group of its own
// and kills the group when the shell ends (so a check's background
// leftovers do not pile up, one per interval), when timeout passes, or
// when ctx ends.
func run(ctx context.Context, command string, timeout time.Duration) result {
	r, w, err := os.Pipe()
	if err != nil {
		return result{exitCode: -1, startErr: err}
	}
	defer r.Close()
	cmd := osexec.Command("/bin/sh", "-c", command)
	cmd.Stdout = w // a file, not a writer: no copying goroutine for Wait to wait on
	cmd.Env = checkEnv(os.Environ())
	// Its own group, killed whole on timeout; and SIGKILL if this plugin
	// dies mid-check (its agent SIGKILLed it, or died), so the check's
	// shell does not outlive it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	_ = w.Close() // the child has its copy; EOF comes when the last holder ends
	if err != nil {
		return result{exitCode: -1, startErr: err}
	}
	out := make(chan string, 1)
	go func() { out <- readHead(r, messageLimit) }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	pgid := cmd.Process.Pid
	var res result
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-exited:
	case <-timer.C:
		res.timedOut = true
		killGroup(pgid)
		<-exited
	case <-ctx.Done():
		killGroup(pgid)
		<-exited
	}
	killGroup(pgid)
	res.exitCode, res.signal = exitStatus(cmd.ProcessState)
	select {
	case res.output = <-out:
	case <-time.After(pipeGrace):
		_ = r.Close() // unblocks readHead, which sends what it has
		res.output = <-out
	}
	return res
}

// killGroup SIGKILLs the process group pgid: the shell, the check it
// runs, and their children. ESRCH (all gone already) is the usual case.
func killGroup(pgid int) {
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

func exitStatus(ps *os.ProcessState) (code int, signal string) {
	if ps == nil {
		return -1, ""
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, fmt.Sprintf("signal %d (%s)", int(ws.Signal()), ws.Signal())
	}
	return ps.ExitCode(), ""
}

// readHead returns the first limit bytes of r and reads the rest into the
// void until EOF or an error (r closed under it).
func readHead(r io.Reader, limit int) string {
	buf := make([]byte, limit)
	n, err := io.ReadFull(r, buf)
	if err == nil {
		_, _ = io.Copy(io.Discard, r)
	}
	return string(buf[:n])
}

// checkEnv is the plugin's environment less what go-plugin put there for
// the plugin alone: its handshake cookie (a ddp-agent plugin run by the
// check would think the agent started it) and its PLUGIN_* settings.
func checkEnv(env []string) []string {
	kept := make([]string, 0, len(env))
	for _, kv := range env {
		if strings.HasPrefix(kv, plugins.MagicCookieKey+"=") || strings.HasPrefix(kv, "PLUGIN_") {
			continue
		}
		kept = append(kept, kv)
	}
	return kept
}

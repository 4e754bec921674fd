package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// node is one launcher process.
type node struct {
	idx     int
	tag     string // the run's, in its environment
	cmd     *exec.Cmd
	pid     int // also its process group id (Setpgid)
	logPath string
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error
	logDone chan struct{} // closed once the log pipe reached EOF

	mu     sync.Mutex
	events map[string][]time.Time
	tail   []string // last lines of its log
}

func (n *node) exited() bool {
	select {
	case <-n.done:
		return true
	default:
		return false
	}
}

// eventsAfter is the first time after t0 the launcher logged event name.
func (n *node) eventsAfter(name string, t0 time.Time) (first time.Time, ok bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, t := range n.events[name] {
		if t.After(t0) && (first.IsZero() || t.Before(first)) {
			first = t
		}
	}
	return first, !first.IsZero()
}

// lastLines is the end of the log, indented, for an error message.
func (n *node) lastLines() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return "    " + strings.Join(n.tail, "\n    ")
}

// startProc starts one process of a run (a launcher, or the probe) in a
// process group of its own, its output stamped line by line into logPath.
func startProc(reap *reaper, idx int, argv, env []string, tag, logPath string, markers []marker) (*node, error) {
	n := &node{
		idx:     idx,
		tag:     tag,
		logPath: logPath,
		done:    make(chan struct{}),
		logDone: make(chan struct{}),
		events:  map[string][]time.Time{},
	}
	logf, err := os.Create(n.logPath)
	if err != nil {
		return nil, err
	}
	// Our own pipe (not an io.Writer for exec), so that Wait returns when
	// the launcher exits even if a worker still holds the pipe; every line
	// is stamped with the time it arrived.
	pr, pw, err := os.Pipe()
	if err != nil {
		logf.Close()
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Env = append(cmd.Env, tagVar+"="+tag, "PYTHONUNBUFFERED=1")
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = pw, pw
	// A process group of its own, so teardown reaches torchrun's workers;
	// SIGKILL if this benchmark dies (its workers follow: ddp-agent's by
	// their parent-death signal, torchrun's by worker.py's orphan check).
	// Pdeathsig fires when the forking thread exits; Go only ends threads
	// whose goroutine locked them, which this program never does.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fmt.Fprintf(logf, "# %s\n", strings.Join(argv, " "))
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		logf.Close()
		return nil, err
	}
	n.cmd, n.pid = cmd, cmd.Process.Pid
	reap.register(tag, n.pid)
	go func() {
		n.waitErr = cmd.Wait()
		close(n.done)
	}()
	go n.copyLog(pr, logf, markers)
	return n, nil
}

// copyLog stamps each line of the process's output into its log, notes
// the markers' events and keeps the last lines, until the pipe ends.
func (n *node) copyLog(pr *os.File, logf *os.File, markers []marker) {
	defer close(n.logDone)
	defer pr.Close()
	defer logf.Close()
	br := bufio.NewReaderSize(pr, 64<<10)
	for {
		line, err := br.ReadString('\n')
		if line != "" {
			now := time.Now()
			line = strings.TrimRight(line, "\r\n")
			fmt.Fprintf(logf, "%s %s\n", now.Format("15:04:05.000000"), line)
			n.mu.Lock()
			for _, m := range markers {
				if strings.Contains(line, m.substr) {
					n.events[m.event] = append(n.events[m.event], now)
				}
			}
			if len(line) > 300 {
				line = line[:300] + "..."
			}
			n.tail = append(n.tail, line)
			if len(n.tail) > 15 {
				n.tail = n.tail[len(n.tail)-15:]
			}
			n.mu.Unlock()
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				fmt.Fprintf(logf, "# log pipe: %v\n", err)
			}
			return
		}
	}
}

// sleepCtx sleeps for d, or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// waitTimeout returns a channel closed when ch is closed or d has passed.
func waitTimeout(ch <-chan struct{}, d time.Duration) <-chan struct{} {
	out := make(chan struct{})
	go func() {
		defer close(out)
		select {
		case <-ch:
		case <-time.After(d):
		}
	}()
	return out
}

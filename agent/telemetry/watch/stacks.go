package watch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// stackWait is how long a rank gets to write its stacks after SIGUSR2;
// remote ranks get another second for the trip.
const stackWait = time.Second

// stacks asks the ranks among ranks that run on this node for their
// Python stacks: the ddp_agent package registered faulthandler on SIGUSR2
// and created its stack file (the signal is sent only then: its default
// action kills).
func (s *Watch) stacks(ctx context.Context, at *attempt, ranks []int) map[int]string {
	out := map[int]string{}
	if at.stackDir == "" {
		return out
	}
	asked := map[int]string{}
	for _, r := range ranks {
		if !at.isLocal(r) {
			continue
		}
		if path := s.signalForStack(at.stackDir, r); path != "" {
			asked[r] = path
		}
	}
	if len(asked) == 0 {
		return out
	}
	// faulthandler writes from the signal handler at once; give the
	// process a moment to be scheduled, and take a dump once it stopped
	// growing.
	deadline := time.Now().Add(stackWait)
	settled := map[int]bool{}
	for len(settled) < len(asked) && time.Now().Before(deadline) && ctx.Err() == nil {
		time.Sleep(50 * time.Millisecond)
		for r, path := range asked {
			b, err := os.ReadFile(path)
			if err != nil || len(b) == 0 {
				continue
			}
			settled[r] = out[r] == string(b)
			out[r] = string(b)
			if !settled[r] {
				delete(settled, r)
			}
		}
	}
	for r, text := range out {
		out[r] = mainThreadFirst(text)
	}
	return out
}

// mainThreadFirst moves the main thread's stack to the front of a
// faulthandler dump of every thread. faulthandler lists the newest thread
// first (the hook's waiter, a data loader's), or the thread the signal
// happened to reach, labelled "Current thread"; the frame a person looks
// for is the training loop's, in the thread that runs the script's
// "<module>" (its oldest frame, or runpy's under python -m). A dump
// without one (faulthandler keeps the newest 100 frames) stays as it is.
func mainThreadFirst(dump string) string {
	blocks := strings.Split(strings.TrimRight(dump, "\n"), "\n\n")
	for i, blk := range blocks {
		if i > 0 && strings.Contains(blk+"\n", " in <module>\n") {
			blocks = append([]string{blk}, append(blocks[:i:i], blocks[i+1:]...)...)
			return strings.Join(blocks, "\n\n") + "\n"
		}
	}
	return dump
}

// whyNoStack says why a process gave no stack, from its state now ("" when
// it tells nothing): a stopped process, or one in uninterruptible sleep,
// runs no signal handler until it wakes.
func whyNoStack(pid int) string {
	if pid <= 0 {
		return ""
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 || i+2 >= len(b) {
		return ""
	}
	switch b[i+2] {
	case 'T', 't':
		return "its process is stopped (SIGSTOP, or a debugger), and runs no signal handler until it continues"
	case 'D':
		return "its process is in uninterruptible sleep (state D: waiting on a disk, a network file system or a driver)"
	case 'Z':
		return "its process has exited"
	}
	return ""
}

// signalForStack sends SIGUSR2 to the process that registered rank r's
// stack file in dir and returns the file, or "" when there is none to ask.
// The package names its file after the process that registered the
// handler: the worker, or a process a wrapper script started. Only that
// one may get the signal (its default action kills), and only if it is
// this rank's worker or one of its descendants.
func (s *Watch) signalForStack(dir string, r int) string {
	if s.cfg.RankOf == nil {
		return ""
	}
	asked := ""
	paths, _ := filepath.Glob(filepath.Join(dir, fmt.Sprintf("rank%d-pid*.txt", r)))
	for _, path := range paths {
		var pid int
		if _, err := fmt.Sscanf(filepath.Base(path), fmt.Sprintf("rank%d-pid%%d.txt", r), &pid); err != nil || pid <= 0 {
			continue
		}
		if got, err := s.cfg.RankOf(pid); err != nil || got != r {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGUSR2); err != nil {
			s.log.Warn("ask for a Python stack", "rank", r, "pid", pid, "err", err)
			continue
		}
		asked = path
	}
	return asked
}

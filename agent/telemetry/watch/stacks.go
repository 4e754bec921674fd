package watch

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
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
	return out
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

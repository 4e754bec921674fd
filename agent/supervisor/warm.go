package supervisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"
)

// A node's first workers can start warm (StartWarm): the agent starts its
// workers' processes as spares before its node joins the rendezvous, and
// may wait for their imports before it joins (a node joining a running
// job: the others then train on while it imports). When the round
// closes, Start gives each one a rank instead of starting a process
// (startFromWarm); one still importing takes it when it is done.

// ErrNotInit is Adopt's error once the group has started.
var ErrNotInit = errors.New("the group has started")

// StartWarm starts n warm spares that Start will make its workers, and
// waits until each has said its imports are done, has exited, ctx is done
// or bound has passed (0: it does not wait). It returns how many said so.
// The group's spec may be provisional (a round's values are not known
// yet): Adopt replaces it before Start, and each process is told its
// world in its assignment. Call it before Start, from Start's goroutine.
func (g *Group) StartWarm(ctx context.Context, n int, bound time.Duration) int {
	ready := make(chan bool, n)
	started := 0
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			g.log.Warn("warm worker not started", "err", err)
			continue
		}
		g.spawnMu.Lock()
		var sp *worker
		if !g.closed {
			sp = g.startSpareReady(w)
		}
		g.spawnMu.Unlock()
		w.Close() // the child has its copy: its exit ends the read below
		if sp == nil {
			r.Close()
			continue
		}
		g.mu.Lock()
		sp.spare.warm = true
		g.mu.Unlock()
		started++
		go func() {
			defer r.Close()
			var b [1]byte
			k, _ := r.Read(b[:])
			ready <- k == 1
		}()
	}
	t := time.NewTimer(bound)
	defer t.Stop()
	n = 0
	for range started {
		select {
		case ok := <-ready:
			if ok {
				n++
			}
		case <-ctx.Done():
			return n
		case <-t.C:
			return n
		}
	}
	return n
}

// Adopt replaces the group's spec with the round's, before Start: the spec
// StartWarm's processes started with was provisional.
func (g *Group) Adopt(spec *Spec) error {
	g.spawnMu.Lock()
	defer g.spawnMu.Unlock()
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.state != StateInit {
		return fmt.Errorf("adopt the round's spec: %w", ErrNotInit)
	}
	if spec.NProc != g.spec.NProc {
		return fmt.Errorf("adopt the round's spec: %d workers, the warm processes are for %d", spec.NProc, g.spec.NProc)
	}
	g.spec = spec
	return nil
}

// startFromWarm gives worker id's rank to an idle spare that StartWarm
// started, and returns it; nil when none is left, or the one tried had
// died (Start then starts a process).
func (g *Group) startFromWarm(id Worker) *worker {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, sp := range g.spares {
		if !sp.spare.warm {
			continue
		}
		g.spares = append(g.spares[:i:i], g.spares[i+1:]...)
		mode := "start"
		if g.spec.Join {
			mode = "join"
		}
		if err := g.give(sp, id, mode); err != nil {
			g.log.Warn("warm worker gone; starting the rank's process afresh", "rank", id.Rank, "err", err)
			return nil
		}
		g.log.Debug("worker started warm", "rank", id.Rank, "local_rank", id.LocalRank, "pid", sp.pid, "mode", mode)
		return sp
	}
	return nil
}

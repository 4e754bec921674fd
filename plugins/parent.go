package plugins

import (
	"context"
	"os"
	"time"
)

// ParentPoll is how often a served plugin looks whether the agent that
// started it is still its parent.
const ParentPoll = 500 * time.Millisecond

// WatchParent calls gone once, and returns, when this process's parent
// changes: the parent died and the process was handed to init or a
// subreaper. It returns without calling gone when ctx ends.
//
// go-plugin does not stop its plugins when the host is SIGKILLed, and a
// plugin left behind would run its checks (and hold its GPUs' files, its
// ports) for nobody. The agent also starts each plugin with Pdeathsig;
// this is the belt to those braces, for a plugin started some other way
// or a parent thread that is not the agent's main one.
func WatchParent(ctx context.Context, gone func()) {
	watchParent(ctx, ParentPoll, os.Getppid, gone)
}

func watchParent(ctx context.Context, every time.Duration, getppid func() int, gone func()) {
	parent := getppid()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if getppid() != parent {
				gone()
				return
			}
		}
	}
}

package nic

import (
	"context"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/probe"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// readTimeout bounds one look at a port. Reading an interface's speed
// takes the kernel's RTNL lock and calls into the driver, which a wedged
// driver can hold for good; the look then turns into a warning and the
// other ports are still judged.
const readTimeout = 2 * time.Second

// watcher is one Watch's memory: the last look at each port, for the
// flapping check, and each port's bounded reader.
type watcher struct {
	cfg   config
	ports []port
	read  func(sysfs string, p port) portState
	prev  map[string]portState
	runs  map[string]*probe.Bounded[portState]
}

func newWatcher(cfg config, ports []port, read func(string, port) portState) *watcher {
	w := &watcher{cfg: cfg, ports: ports, read: read, prev: map[string]portState{}, runs: map[string]*probe.Bounded[portState]{}}
	for _, p := range ports {
		w.runs[p.Name] = &probe.Bounded[portState]{}
	}
	return w
}

// check looks at every port at once (one stuck read must not delay the
// others) and returns a verdict for each, in the ports' order.
func (w *watcher) check(ctx context.Context) []detector.Finding {
	now := time.Now()
	looks := make([]portState, len(w.ports))
	var wg sync.WaitGroup
	for i, p := range w.ports {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st, err := w.runs[p.Name].Run(ctx, readTimeout, func() portState { return w.read(w.cfg.sysfs, p) })
			if err != nil {
				st = portState{Present: true, Err: err, Changes: -1, RateMbps: -1}
			}
			looks[i] = st
		}()
	}
	wg.Wait()
	out := make([]detector.Finding, len(w.ports))
	for i, p := range w.ports {
		var prev *portState
		if st, ok := w.prev[p.Name]; ok {
			prev = &st
		}
		out[i] = judge(p, prev, looks[i], w.cfg.minRate)
		out[i].Time = now
		if looks[i].Err == nil { // an unknown look says nothing for the next one to compare with
			w.prev[p.Name] = looks[i]
		}
	}
	return out
}

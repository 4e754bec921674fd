package disk

import (
	"context"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/bundled/internal/probe"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

// watcher is one Watch's bounded look at each path.
type watcher struct {
	cfg    config
	sample func(path string) sample
	runs   map[string]*probe.Bounded[sample]
}

func newWatcher(cfg config, take func(string) sample) *watcher {
	w := &watcher{cfg: cfg, sample: take, runs: map[string]*probe.Bounded[sample]{}}
	for _, p := range cfg.paths {
		w.runs[p] = &probe.Bounded[sample]{}
	}
	return w
}

// check looks at every path at once, each for at most the timeout option
// (a hung NFS mount must not hide the others, nor stop the heartbeat),
// and returns a verdict for each, in the paths' order.
func (w *watcher) check(ctx context.Context) []detector.Finding {
	now := time.Now()
	out := make([]detector.Finding, len(w.cfg.paths))
	var wg sync.WaitGroup
	for i, p := range w.cfg.paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := w.runs[p].Run(ctx, w.cfg.timeout, func() sample { return w.sample(p) })
			out[i] = judge(p, s, err, w.cfg)
			out[i].Time = now
		}()
	}
	wg.Wait()
	return out
}

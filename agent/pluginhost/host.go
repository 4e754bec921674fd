// Package pluginhost runs ddp-agent's plugins (package plugins): each
// --plugin is a child process started over go-plugin, that dies with the
// agent. A detector's findings go to the agent's fault path; the job's
// events go to every notifier through a bounded queue of its own. A
// plugin that crashes or hangs is logged, reported to the notifiers and
// restarted with backoff; it never stops training.
package pluginhost

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// Config is what the host needs; zero durations take the defaults.
type Config struct {
	Specs []Spec
	Dir   string // where the bundled plugins' binary is (BundledDir)
	Job   string // the run id, on every event
	Node  string // this node's name, on every event; "" is the hostname
	// OnFinding receives every detector verdict that asks for more than a
	// warning (restart-workers, drain-node), each time it is sent. It must
	// not block.
	OnFinding func(Finding)
	// Attempt, when set, is the job's current generation and attempt,
	// stamped on each event that comes without them: a straggler, a
	// detector's finding, a plugin's failure are told from outside the
	// agent's loop, which alone knows them. The host's goroutines call
	// it: it must be safe for concurrent use, and not block.
	Attempt func() (generation uint64, attempt int)

	StartTimeout  time.Duration // a plugin's handshake (default 10 s)
	CallTimeout   time.Duration // Info, Configure (default 10 s)
	NotifyTimeout time.Duration // one Notify (default 10 s)
	HangGrace     time.Duration // a detector silent 2 × Every + this is hung (default 5 s)
	QueueSize     int           // events waiting per notifier (default 1024)
	FirstBackoff  time.Duration // the wait after a plugin's first failure (default 1 s)
	MaxBackoff    time.Duration // the longest (default 30 s)
}

func (c *Config) defaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.StartTimeout, 10*time.Second)
	def(&c.CallTimeout, 10*time.Second)
	def(&c.NotifyTimeout, 10*time.Second)
	def(&c.HangGrace, 5*time.Second)
	def(&c.FirstBackoff, time.Second)
	def(&c.MaxBackoff, 30*time.Second)
	if c.QueueSize <= 0 {
		c.QueueSize = 1024
	}
	if c.Node == "" {
		c.Node, _ = os.Hostname()
	}
	if c.OnFinding == nil {
		c.OnFinding = func(Finding) {}
	}
}

// Finding is a detector plugin's verdict, with the plugin that sent it.
type Finding struct {
	Plugin string
	detector.Finding
}

// Host runs the plugins of one agent.
type Host struct {
	cfg       Config
	log       *slog.Logger
	ctx       context.Context // the plugins' life: Close ends it
	cancel    context.CancelFunc
	runners   []*runner
	verdicts  *verdicts
	wg        sync.WaitGroup
	closeOnce sync.Once
}

// Start launches and configures every plugin. A plugin refused (a
// missing binary, another protocol version, a bad option) fails Start
// with one line, and the agent does not start the job; one that fails
// otherwise (crashes at start, times out) is logged and retried in the
// background.
func Start(cfg Config, log *slog.Logger) (*Host, error) {
	cfg.defaults()
	ctx, cancel := context.WithCancel(context.Background())
	h := &Host{cfg: cfg, log: log.With("subsystem", "plugins"), ctx: ctx, cancel: cancel}
	h.verdicts = newVerdicts(h)
	type started struct {
		sp    Spec
		p     *proc
		sched detector.Schedule
		err   error
	}
	if err := checkBundled(ctx, cfg.Dir, cfg.Specs); err != nil {
		cancel()
		return nil, err
	}
	// All at once: each start is bounded by StartTimeout, and one after
	// another, three plugins that never finished their handshake held the
	// job's start 36 s.
	all := make([]started, len(cfg.Specs))
	var wg sync.WaitGroup
	for i, sp := range cfg.Specs {
		wg.Go(func() {
			p, sched, err := h.start(ctx, sp)
			all[i] = started{sp, p, sched, err}
		})
	}
	wg.Wait()
	for _, s := range all {
		var refused *RefusedError
		if errors.As(s.err, &refused) {
			for _, s := range all {
				if s.err == nil {
					s.p.kill()
				}
			}
			cancel()
			return nil, s.err
		}
	}
	// Every runner exists before any runs: a running one notifies them all.
	for _, s := range all {
		h.runners = append(h.runners, newRunner(h, s.sp))
	}
	for i, s := range all {
		if s.err == nil { // a failure is logged by the runner, which retries it in the background
			h.log.Info("plugin started", "plugin", s.sp.Name, "kind", string(s.p.info.Kind), "version", s.p.info.Version)
		}
		r := h.runners[i]
		h.goRun(func() { r.run(s.p, s.sched, s.err) })
	}
	return h, nil
}

// checkBundled refuses a bundled plugin's name that ddp-agent-plugins
// does not serve: started, it would only fail its handshake over and over.
func checkBundled(ctx context.Context, dir string, specs []Spec) error {
	var names []string
	for _, sp := range specs {
		if sp.Path != "" {
			continue
		}
		if names == nil {
			var err error
			if names, err = Bundled(ctx, dir); err != nil {
				return &RefusedError{Plugin: sp.Name, Err: err}
			}
		}
		if !slices.Contains(names, sp.Name) {
			return &RefusedError{Plugin: sp.Name, Err: fmt.Errorf("no bundled plugin of that name (bundled: %s; an external one is given by its path)", strings.Join(names, ", "))}
		}
	}
	return nil
}

func (h *Host) goRun(f func()) {
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		f()
	}()
}

// Notify queues ev for every notifier; it never blocks. It fills in what
// ev leaves out: the time, the job, the node, and the current generation
// and attempt (Config.Attempt). A notifier whose queue is full drops the
// event and counts it.
func (h *Host) Notify(ev notifier.Event) {
	if h == nil {
		return
	}
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	if ev.Job == "" {
		ev.Job = h.cfg.Job
	}
	if ev.Node == "" {
		ev.Node = h.cfg.Node
	}
	if ev.Attempt == 0 && h.cfg.Attempt != nil {
		ev.Generation, ev.Attempt = stamp(ev.Generation, h.cfg.Attempt)
	}
	for _, r := range h.runners {
		r.enqueue(ev)
	}
}

// stamp is the generation and attempt of an event told with generation
// gen and attempt 0. Zero for both is none: the current ones. The current
// generation is the current attempt's (each attempt runs in a round, each
// round a generation of its own): a reformed event names its generation
// alone. Any other generation is an earlier attempt's, whose number the
// host does not know. Stamping the loop's events of generation 0's first
// attempt, told while it is the current one, changes nothing.
func stamp(gen uint64, current func() (uint64, int)) (uint64, int) {
	curGen, curAttempt := current()
	if gen == 0 || gen == curGen {
		return curGen, curAttempt
	}
	return gen, 0
}

// Close delivers what the notifiers still hold, within flush, then stops
// every plugin and logs what each notifier delivered, failed and dropped.
func (h *Host) Close(flush time.Duration) {
	if h == nil {
		return
	}
	h.closeOnce.Do(func() {
		deadline := time.Now().Add(flush)
		for _, r := range h.runners {
			r.drain(deadline)
		}
		h.cancel()
		h.wg.Wait()
		for _, r := range h.runners {
			r.summary()
		}
	})
}

// pluginFailed logs a plugin's crash or hang and tells the notifiers.
func (h *Host) pluginFailed(sp Spec, err error, wait time.Duration) {
	h.log.Error("plugin failed; restarting it", "plugin", sp.Name, "err", err, "in", wait)
	h.Notify(notifier.Event{Kind: notifier.PluginFailed, Rank: -1, Message: fmt.Sprintf("plugin %s: %v", sp.Name, err),
		Details: map[string]string{"plugin": sp.Name, "restart_in": wait.String()}})
}

// sleep waits d or until the host closes; false: it closed.
func (h *Host) sleep(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-h.ctx.Done():
		return false
	}
}

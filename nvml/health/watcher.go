package health

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// Watcher watches GPUs through NVML, in the spirit of DCGM's health
// watches: it listens to NVML events (XIDs, uncorrectable ECC errors,
// poison, DRAM retirement, GPU unavailable, GPU recovery action) and polls,
// every interval, what has no event (pending page retirement and row
// remapping, slowdown clock reasons, temperature, NVLink and PCIe error
// counters, the recovery action). Each observation becomes a Finding
// with the action it calls for, the GPU's UUID and the ranks on it, is
// logged, and is queued for the consumer (Next, or Ready and Drain).
//
// Delivery never blocks the watcher and loses nothing: findings go into a
// queue guarded by a mutex, and a finding identical to one still queued
// only increments that one's Count. The queue thus holds one entry per
// distinct finding, however long the consumer takes: an event storm adds a
// count per event (events of one GPU and XID or event type are identical),
// and polling adds at most one entry per check and GPU per interval (NVLink
// and PCIe counts are in the message, so those do not merge). The consumer
// gets the first occurrence in full and the count of the rest. A bounded
// channel would have to block the event loop or drop; an unbounded one
// would grow with the storm. Log lines are limited likewise: an identical
// finding is logged at most once a second at its level (warn for
// ActionIgnore, error otherwise) with the number of repeats, the repeats
// themselves at debug.
//
// Run watches until its context is done. The other methods are safe for
// concurrent use, also while Run runs.
type Watcher struct {
	lib         gonvml.Interface
	devices     []Device
	logger      *slog.Logger
	interval    time.Duration
	ranks       func(gpu int) []int
	now         func() time.Time
	tempLimit   uint32
	nvlinkLimit uint64
	xidActions  map[uint64]Action

	waitTimeout time.Duration // of one EventSet.Wait
	stopGrace   time.Duration // how long Run waits for an NVML call in flight once ctx is done
	logEvery    time.Duration // identical findings are logged at most this often (the rest at debug)

	running atomic.Bool
	symbols map[string]bool // NVML symbols the driver lacks → false; written before Run's goroutines start

	mu      sync.Mutex
	pending []*Finding
	index   map[findingKey]*Finding
	logged  map[findingKey]logState
	stats   Stats
	ready   chan struct{} // holds a token while findings may be pending
}

type findingKey struct {
	gpu     int
	uuid    string
	kind    Kind
	xid     uint64
	action  Action
	message string
}

type logState struct {
	at         time.Time
	suppressed int
}

// NewWatcher returns a watcher of devices over lib, which the caller
// has opened (nvml.Open) and shuts down after Run returns. With no
// devices it watches every GPU NVML reports.
func NewWatcher(lib *nvml.Lib, devices []Device, opts ...Option) *Watcher {
	w := &Watcher{
		lib:         nvmlapi.Unwrap(lib),
		devices:     slices.Clone(devices),
		logger:      slog.Default(),
		interval:    10 * time.Second,
		now:         time.Now,
		nvlinkLimit: 100,
		xidActions:  map[uint64]Action{},
		waitTimeout: 500 * time.Millisecond,
		stopGrace:   3 * time.Second,
		logEvery:    time.Second,
		index:       map[findingKey]*Finding{},
		logged:      map[findingKey]logState{},
		ready:       make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Ready returns a channel that receives when findings may be waiting; call
// Drain then. A receive may find nothing to drain.
func (w *Watcher) Ready() <-chan struct{} { return w.ready }

// Drain returns the findings queued since the last Drain, oldest first, and
// empties the queue. It never blocks on the watcher's NVML calls.
func (w *Watcher) Drain() []Finding {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.pending) == 0 {
		return nil
	}
	out := make([]Finding, len(w.pending))
	for i, f := range w.pending {
		out[i] = *f
	}
	w.pending = nil
	clear(w.index)
	return out
}

// Next blocks until findings are queued and returns them as Drain does, or
// returns ctx's error when ctx is done first.
func (w *Watcher) Next(ctx context.Context) ([]Finding, error) {
	for {
		if f := w.Drain(); len(f) > 0 {
			return f, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-w.ready:
		}
	}
}

// Stats returns the counters.
func (w *Watcher) Stats() Stats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// watchedGPU is one watched GPU.
type watchedGPU struct {
	Device
	dev      gonvml.Device
	lost     atomic.Bool
	recovery atomic.Int64 // last recovery action seen, -1 before the first

	poll pollState // owned by the poll goroutine
}

// Run watches the GPUs until ctx is done, then returns nil. NVML errors are
// logged and never end it: an event set that cannot be made or registered
// leaves polling alone, a check NVML does not support is dropped for that
// GPU, other errors are retried. NVML calls cannot be interrupted, so Run
// waits up to a few seconds for one in flight after ctx is done and then
// returns anyway, leaving that call's goroutine to finish on its own. Run
// may be called once.
func (w *Watcher) Run(ctx context.Context) error {
	if w.lib == nil {
		return errors.New("gpu health watcher: no NVML library")
	}
	if !w.running.CompareAndSwap(false, true) {
		return errors.New("gpu health watcher: Run called twice")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.watch(ctx)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
	}
	t := time.NewTimer(w.stopGrace)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		w.logger.Warn("GPU health watcher: an NVML call has not returned; stopping without it", "waited", w.stopGrace)
	}
	return nil
}

// watch runs the event loop and the poll loop until ctx is done.
func (w *Watcher) watch(ctx context.Context) {
	w.symbols = map[string]bool{}
	for _, s := range newerSymbols {
		if !nvmlapi.HasSymbol(w.lib, s) {
			w.symbols[s] = false
		}
	}
	gpus := w.resolve()
	if len(gpus) == 0 {
		w.logger.Warn("GPU health watcher: no GPU to watch")
		<-ctx.Done()
		return
	}
	if ctx.Err() != nil {
		return
	}
	var wg sync.WaitGroup
	if set := w.register(gpus); set != nil {
		wg.Go(func() { w.eventLoop(ctx, set, gpus) })
	}
	w.pollLoop(ctx, gpus)
	wg.Wait()
}

// resolve finds the NVML handles of the devices to watch.
func (w *Watcher) resolve() []*watchedGPU {
	devs := w.devices
	if len(devs) == 0 {
		n, ret := nvmlapi.Call(w.lib.DeviceGetCount)
		if ret != gonvml.SUCCESS {
			w.logger.Error("GPU health watcher: count GPUs", "err", ret.Error())
			return nil
		}
		for i := range n {
			devs = append(devs, Device{Index: i})
		}
	}
	var gpus []*watchedGPU
	for _, d := range devs {
		var dev gonvml.Device
		var ret gonvml.Return
		if d.UUID != "" {
			dev, ret = nvmlapi.Call(func() (gonvml.Device, gonvml.Return) { return w.lib.DeviceGetHandleByUUID(d.UUID) })
		} else {
			dev, ret = nvmlapi.Call(func() (gonvml.Device, gonvml.Return) { return w.lib.DeviceGetHandleByIndex(d.Index) })
			if ret == gonvml.SUCCESS && dev != nil {
				d.UUID, _ = nvmlapi.Call(dev.GetUUID)
			}
		}
		if ret != gonvml.SUCCESS || dev == nil {
			w.logger.Error("GPU health watcher: GPU not found; not watching it", "gpu", d.Index, "uuid", d.UUID, "err", ret.Error())
			continue
		}
		g := &watchedGPU{Device: d, dev: dev}
		g.recovery.Store(-1)
		gpus = append(gpus, g)
	}
	return gpus
}

// markLost records, once per GPU, that NVML has lost the GPU.
func (w *Watcher) markLost(g *watchedGPU, during string) {
	if g.lost.CompareAndSwap(false, true) {
		w.record(g, KindUnavailable, 0, ActionDrainNode,
			"GPU is lost (NVML_ERROR_GPU_IS_LOST during "+during+"): fallen off the bus or otherwise inaccessible")
	}
}

// record queues a finding (or coalesces it into a queued one), logs it and
// wakes the consumer. It never blocks on the consumer.
func (w *Watcher) record(g *watchedGPU, kind Kind, xid uint64, action Action, msg string) {
	now := w.now()
	var ranks []int
	if w.ranks != nil && g.Index >= 0 {
		ranks = slices.Clone(w.ranks(g.Index))
	}
	key := findingKey{gpu: g.Index, uuid: g.UUID, kind: kind, xid: xid, action: action, message: msg}

	w.mu.Lock()
	w.stats.Findings++
	if f, ok := w.index[key]; ok {
		f.Count++
		f.Last = now
		w.stats.Coalesced++
	} else {
		f := &Finding{Time: now, Last: now, Count: 1, GPU: g.Index, UUID: g.UUID, Ranks: ranks,
			Kind: kind, XID: xid, Message: msg, Action: action}
		w.index[key] = f
		w.pending = append(w.pending, f)
	}
	ls, seen := w.logged[key]
	logNow := !seen || now.Sub(ls.at) >= w.logEvery
	repeats := ls.suppressed
	if logNow {
		if len(w.logged) >= 1024 {
			for k, s := range w.logged {
				if now.Sub(s.at) >= w.logEvery && s.suppressed == 0 {
					delete(w.logged, k)
				}
			}
		}
		w.logged[key] = logState{at: now}
	} else {
		ls.suppressed++
		w.logged[key] = ls
	}
	w.mu.Unlock()

	level := slog.LevelError
	if action == ActionIgnore {
		level = slog.LevelWarn
	}
	if !logNow {
		level = slog.LevelDebug
	}
	attrs := []slog.Attr{
		slog.Int("gpu", g.Index), slog.String("uuid", g.UUID), slog.Any("ranks", ranks),
		slog.String("kind", string(kind)), slog.String("action", action.String()),
	}
	if kind == KindXID {
		attrs = append(attrs, slog.Uint64("xid", xid))
	}
	if logNow && repeats > 0 {
		attrs = append(attrs, slog.Int("repeated", repeats))
	}
	w.logger.LogAttrs(context.Background(), level, "GPU health: "+msg, attrs...)

	select { // after the log line, so that the log tells what the agent acts on first
	case w.ready <- struct{}{}:
	default:
	}
}

// have reports whether the driver has the NVML function name.
func (w *Watcher) have(name string) bool {
	ok, known := w.symbols[name]
	return ok || !known
}

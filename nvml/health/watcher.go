package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// Device names a GPU for the Watcher: its NVML index and UUID.
type Device struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// Kind says where a finding comes from.
type Kind string

// The kinds of finding.
const (
	KindXID         Kind = "xid"             // an XID critical-error event
	KindECC         Kind = "ecc"             // ECC, poison and DRAM-retirement events
	KindRecovery    Kind = "recovery-action" // the driver's GPU recovery action
	KindUnavailable Kind = "gpu-unavailable" // GPU-unavailable event, or NVML_ERROR_GPU_IS_LOST
	KindMemory      Kind = "memory"          // retired pages, row remapping (polled)
	KindClocks      Kind = "clocks"          // slowdown clock-event reasons (polled)
	KindTemperature Kind = "temperature"     // GPU temperature (polled)
	KindNVLink      Kind = "nvlink"          // NVLink error counters and link state (polled)
	KindPCIe        Kind = "pcie"            // PCIe replay counter (polled)
)

// Finding is one health observation about one GPU. Identical findings
// (same GPU, kind, XID, message and action) that arrive before the consumer
// drains them are coalesced into one: Time is the first occurrence, Last the
// latest, Count how many there were.
type Finding struct {
	Time    time.Time `json:"time"`
	Last    time.Time `json:"last"`
	Count   int       `json:"count"`
	GPU     int       `json:"gpu"` // NVML index; -1 when NVML named a device the watcher does not know
	UUID    string    `json:"uuid"`
	Ranks   []int     `json:"ranks,omitempty"` // global ranks on the GPU when the finding was made
	Kind    Kind      `json:"kind"`
	XID     uint64    `json:"xid,omitempty"` // for KindXID
	Message string    `json:"message"`
	Action  Action    `json:"action"`
}

// Decide returns the most severe action of findings (drain > reset >
// restart > ignore); ActionIgnore when there are none.
func Decide(findings []Finding) Action {
	a := ActionIgnore
	for _, f := range findings {
		a = max(a, f.Action)
	}
	return a
}

// Stats counts what a Watcher has seen since it was made.
type Stats struct {
	Events    uint64 `json:"events"`    // NVML events received
	Findings  uint64 `json:"findings"`  // occurrences recorded, coalesced ones included
	Coalesced uint64 `json:"coalesced"` // occurrences merged into a finding not yet drained
}

// Option configures a Watcher.
type Option func(*Watcher)

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option {
	return func(w *Watcher) {
		if l != nil {
			w.logger = l
		}
	}
}

// WithInterval sets how often the watcher polls what NVML has no
// events for (default 10s); d <= 0 keeps the default.
func WithInterval(d time.Duration) Option {
	return func(w *Watcher) {
		if d > 0 {
			w.interval = d
		}
	}
}

// WithRanks sets the function that names the global ranks on a GPU
// (by NVML index); it is called each time a finding is made, so it may
// answer differently from one generation to the next. It is called from the
// watcher's goroutines: it must be safe for concurrent use and not block.
func WithRanks(ranks func(gpu int) []int) Option {
	return func(w *Watcher) { w.ranks = ranks }
}

// WithClock sets the clock that stamps findings (default time.Now).
func WithClock(now func() time.Time) Option {
	return func(w *Watcher) {
		if now != nil {
			w.now = now
		}
	}
}

// WithTemperatureLimit sets the GPU temperature, in °C, at or above
// which the watcher warns. By default it is 5 °C below the GPU's slowdown
// threshold, or 85 °C where NVML does not give that threshold.
func WithTemperatureLimit(celsius uint32) Option {
	return func(w *Watcher) { w.tempLimit = celsius }
}

// WithNVLinkErrorLimit sets how many NVLink errors (replay, recovery,
// CRC and ECC counters, all links of a GPU together) within one poll
// interval turn the NVLink warning into ActionResetGPU (default 100; 0
// keeps the default). Any growth below it is a warning.
func WithNVLinkErrorLimit(n uint64) Option {
	return func(w *Watcher) {
		if n > 0 {
			w.nvlinkLimit = n
		}
	}
}

// WithXIDActions overrides the action of some XIDs (see XIDCatalog);
// the map is copied.
func WithXIDActions(actions map[uint64]Action) Option {
	return func(w *Watcher) {
		for code, a := range actions {
			w.xidActions[code] = a
		}
	}
}

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
// has initialized (lib.Init) and shuts down after Run returns. With no
// devices it watches every GPU NVML reports.
func NewWatcher(lib gonvml.Interface, devices []Device, opts ...Option) *Watcher {
	w := &Watcher{
		lib:         lib,
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

// eventMask is the NVML events the watcher registers for. Single-bit
// ECC errors are corrected and left out (a storm of them is its own event);
// P-state, clock, power-source and MIG-change events are not health.
const eventMask uint64 = gonvml.EventTypeXidCriticalError |
	gonvml.EventTypeDoubleBitEccError |
	gonvml.EventTypeSingleBitEccErrorStorm |
	gonvml.EventTypeDramRetirementEvent |
	gonvml.EventTypeDramRetirementFailure |
	gonvml.EventTypeNonFatalPoisonError |
	gonvml.EventTypeFatalPoisonError |
	gonvml.EventTypeGpuUnavailableError |
	gonvml.EventTypeGpuRecoveryAction

var eventTypeNames = map[uint64]string{
	gonvml.EventTypeXidCriticalError:       "xid",
	gonvml.EventTypeDoubleBitEccError:      "ecc-dbe",
	gonvml.EventTypeSingleBitEccErrorStorm: "ecc-sbe-storm",
	gonvml.EventTypeDramRetirementEvent:    "dram-retirement",
	gonvml.EventTypeDramRetirementFailure:  "dram-retirement-failure",
	gonvml.EventTypeNonFatalPoisonError:    "poison",
	gonvml.EventTypeFatalPoisonError:       "fatal-poison",
	gonvml.EventTypeGpuUnavailableError:    "gpu-unavailable",
	gonvml.EventTypeGpuRecoveryAction:      "recovery-action",
}

// eventNames spells an event-type mask, "xid,ecc-dbe".
func eventNames(mask uint64) string {
	var names []string
	for m := mask; m != 0; m &= m - 1 {
		bit := m & -m
		if n, ok := eventTypeNames[bit]; ok {
			names = append(names, n)
		} else {
			names = append(names, fmt.Sprintf("0x%x", bit))
		}
	}
	return strings.Join(names, ",")
}

// register makes the event set and registers every GPU's events, skipping
// what a GPU does not support. It returns nil when no GPU has any event.
func (w *Watcher) register(gpus []*watchedGPU) gonvml.EventSet {
	set, ret := nvmlapi.Call(w.lib.EventSetCreate)
	if ret != gonvml.SUCCESS || set == nil {
		w.logger.Warn("GPU health watcher: NVML events unavailable; polling only", "err", ret.Error())
		return nil
	}
	anyEvents := false
	for _, g := range gpus {
		want := eventMask
		if sup, ret := nvmlapi.Call(g.dev.GetSupportedEventTypes); ret == gonvml.SUCCESS {
			want &= sup
		}
		got := w.registerGPU(g, set, want)
		if skipped := eventMask &^ got; skipped != 0 {
			w.logger.Info("GPU health watcher: NVML events not supported by this GPU; skipped",
				"gpu", g.Index, "uuid", g.UUID, "skipped", eventNames(skipped), "registered", eventNames(got))
		}
		anyEvents = anyEvents || got != 0
	}
	if !anyEvents {
		w.logger.Warn("GPU health watcher: no GPU supports the NVML events; polling only")
		nvmlapi.CallRet(set.Free)
		return nil
	}
	return set
}

// registerGPU registers want for g, all at once and, when NVML refuses the
// mask (it then registers none of it), one type at a time. It returns what
// was registered.
func (w *Watcher) registerGPU(g *watchedGPU, set gonvml.EventSet, want uint64) uint64 {
	if want == 0 {
		return 0
	}
	ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.RegisterEvents(want, set) })
	switch ret {
	case gonvml.SUCCESS:
		return want
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT:
	case gonvml.ERROR_GPU_IS_LOST:
		w.markLost(g, "register events")
		return 0
	default:
		w.logger.Warn("GPU health watcher: register NVML events; trying one type at a time",
			"gpu", g.Index, "uuid", g.UUID, "events", eventNames(want), "err", ret.Error())
	}
	var got uint64
	for m := want; m != 0; m &= m - 1 {
		bit := m & -m
		ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.RegisterEvents(bit, set) })
		switch ret {
		case gonvml.SUCCESS:
			got |= bit
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_FUNCTION_NOT_FOUND:
		default:
			w.logger.Warn("GPU health watcher: register NVML event", "gpu", g.Index, "uuid", g.UUID,
				"event", eventNames(bit), "err", ret.Error())
		}
	}
	return got
}

// eventLoop waits on set until ctx is done, then frees it. Wait errors
// other than the timeout back off (up to 5s) and are logged once per run
// of the same error.
func (w *Watcher) eventLoop(ctx context.Context, set gonvml.EventSet, gpus []*watchedGPU) {
	defer func() {
		if ret := nvmlapi.CallRet(set.Free); ret != gonvml.SUCCESS {
			w.logger.Warn("GPU health watcher: free NVML event set", "err", ret.Error())
		}
	}()
	ms := uint32(max(w.waitTimeout/time.Millisecond, 1))
	lastErr := gonvml.SUCCESS
	var backoff time.Duration
	for ctx.Err() == nil {
		data, ret := nvmlapi.Call(func() (gonvml.EventData, gonvml.Return) { return set.Wait(ms) })
		switch ret {
		case gonvml.SUCCESS, gonvml.ERROR_TIMEOUT:
			if lastErr != gonvml.SUCCESS {
				w.logger.Info("GPU health watcher: NVML event wait works again")
				lastErr, backoff = gonvml.SUCCESS, 0
			}
			if ret == gonvml.SUCCESS {
				w.handleEvent(data, gpus)
			}
			continue
		}
		if ret != lastErr {
			w.logger.Warn("GPU health watcher: NVML event wait failed; retrying", "err", ret.Error())
			lastErr = ret
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// handleEvent turns one NVML event into a finding.
func (w *Watcher) handleEvent(data gonvml.EventData, gpus []*watchedGPU) {
	w.mu.Lock()
	w.stats.Events++
	w.mu.Unlock()
	g := w.gpuOf(data.Device, gpus)
	et := data.EventType
	switch {
	case et&gonvml.EventTypeXidCriticalError != 0:
		w.xidFinding(g, data)
	case et&gonvml.EventTypeDoubleBitEccError != 0:
		w.record(g, KindECC, 0, w.xidAction(48), "double-bit (uncorrectable) ECC error; a GPU reset clears it (as Xid 48)")
	case et&gonvml.EventTypeFatalPoisonError != 0:
		w.record(g, KindECC, 0, w.xidAction(95), "fatal poison error: uncontained memory error (as Xid 95)")
	case et&gonvml.EventTypeNonFatalPoisonError != 0:
		w.record(g, KindECC, 0, w.xidAction(94), "non-fatal poison error: contained memory error (as Xid 94)")
	case et&gonvml.EventTypeDramRetirementFailure != 0:
		w.record(g, KindECC, 0, w.xidAction(64), "DRAM retirement (row remapping) failed (as Xid 64)")
	case et&gonvml.EventTypeDramRetirementEvent != 0:
		w.record(g, KindECC, 0, w.xidAction(63), "DRAM retirement (row remapping) pending until GPU reset (as Xid 63)")
	case et&gonvml.EventTypeSingleBitEccErrorStorm != 0:
		w.record(g, KindECC, 0, w.xidAction(92), "single-bit ECC error storm (corrected; as Xid 92)")
	case et&gonvml.EventTypeGpuUnavailableError != 0:
		w.record(g, KindUnavailable, 0, ActionDrainNode, "GPU unavailable")
	case et&gonvml.EventTypeGpuRecoveryAction != 0:
		a, desc, ok := w.readRecovery(g)
		if !ok {
			w.record(g, KindRecovery, 0, ActionIgnore, "GPU recovery action changed; NVML does not say to what")
			return
		}
		w.record(g, KindRecovery, 0, a, "GPU recovery action: "+desc)
	default:
		w.record(g, KindECC, 0, ActionIgnore, fmt.Sprintf("NVML event type 0x%x", et))
	}
}

// xidFinding records an XID event.
func (w *Watcher) xidFinding(g *watchedGPU, data gonvml.EventData) {
	x := XIDClassify(data.EventData)
	action := w.xidAction(x.Code)
	msg := fmt.Sprintf("Xid %d %s: %s", x.Code, x.Mnemonic, x.Description)
	if data.GpuInstanceId != 0xFFFFFFFF {
		msg += fmt.Sprintf(" (MIG GPU instance %d, compute instance %d)", data.GpuInstanceId, data.ComputeInstanceId)
	}
	if x.Code == 154 {
		if a, desc, ok := w.readRecovery(g); ok {
			action = a
			msg += "; recovery action: " + desc
		}
	}
	w.record(g, KindXID, x.Code, action, msg)
}

// xidAction is the action for code, overrides first.
func (w *Watcher) xidAction(code uint64) Action {
	if a, ok := w.xidActions[code]; ok {
		return a
	}
	return XIDClassify(code).Action
}

// gpuOf finds the watched GPU an event names, by handle, then by UUID.
func (w *Watcher) gpuOf(dev gonvml.Device, gpus []*watchedGPU) *watchedGPU {
	if dev == nil {
		return &watchedGPU{Device: Device{Index: -1}}
	}
	for _, g := range gpus {
		if sameDevice(g.dev, dev) {
			return g
		}
	}
	uuid, _ := nvmlapi.Call(dev.GetUUID)
	for _, g := range gpus {
		if uuid != "" && g.UUID == uuid {
			return g
		}
	}
	return &watchedGPU{Device: Device{Index: -1, UUID: uuid}}
}

// sameDevice compares two handles; handles of a type that cannot be
// compared are not the same.
func sameDevice(a, b gonvml.Device) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
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

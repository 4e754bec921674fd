package health

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// logBuffer collects what a watcher logs, for tests that count log lines.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// count counts the lines that contain every one of subs.
func (l *logBuffer) count(subs ...string) int {
	n := 0
	for line := range strings.Lines(l.String()) {
		all := true
		for _, s := range subs {
			all = all && strings.Contains(line, s)
		}
		if all {
			n++
		}
	}
	return n
}

// fixture is a DGX A100 from go-nvml's mocks with an event set fed by
// a channel (nvmltest.Events), and every polled check answering
// NOT_SUPPORTED (nvmltest.QuietPolls) until a test says otherwise. Set the
// mock functions before start.
type fixture struct {
	server *dgxa100.Server
	events *nvmltest.Events
	set    *mock.EventSet // events.Set
	log    logBuffer

	ranksMu sync.Mutex
	ranks   map[int][]int
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	s := dgxa100.New()
	f := &fixture{server: s, events: nvmltest.NewEvents(s), ranks: map[int][]int{}}
	f.set = f.events.Set
	nvmltest.QuietPolls(s)
	for i := range s.Devices {
		f.ranks[i] = []int{i, 8 + i} // two nodes' worth: this node is group rank 0 and 1 in turn
	}
	return f
}

func (f *fixture) gpu(i int) *dgxa100.Device { return f.server.Devices[i].(*dgxa100.Device) }

func (f *fixture) devices() []Device {
	var out []Device
	for i := range f.server.Devices {
		out = append(out, Device{Index: i, UUID: f.gpu(i).UUID})
	}
	return out
}

func (f *fixture) rankOf(gpu int) []int {
	f.ranksMu.Lock()
	defer f.ranksMu.Unlock()
	return f.ranks[gpu]
}

func (f *fixture) setRanks(m map[int][]int) {
	f.ranksMu.Lock()
	defer f.ranksMu.Unlock()
	f.ranks = m
}

// start runs a watcher over the fixture until the test ends. stop cancels
// it and waits for Run (at most 5s); it may be called more than once.
func (f *fixture) start(t *testing.T, opts ...Option) (w *Watcher, stop func() error) {
	t.Helper()
	logger := slog.New(slog.NewTextHandler(&f.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts = append([]Option{WithLogger(logger), WithRanks(f.rankOf), WithInterval(20 * time.Millisecond)}, opts...)
	w = NewWatcher(f.server, f.devices(), opts...)
	w.waitTimeout = 20 * time.Millisecond
	w.stopGrace = time.Second
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	stop = sync.OnceValue(func() error {
		cancel()
		select {
		case err := <-done:
			return err
		case <-time.After(5 * time.Second):
			return errors.New("Run did not return within 5s of cancel")
		}
	})
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return w, stop
}

// inject delivers one event through the mock event set's Wait.
func (f *fixture) inject(t *testing.T, gpu int, eventType, data uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := f.events.Inject(ctx, gpu, eventType, data); err != nil {
		t.Fatal(err)
	}
}

// await returns the first finding that matches within d.
func await(t *testing.T, w *Watcher, d time.Duration, match func(Finding) bool) Finding {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	var seen []Finding
	for {
		fs, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("no matching finding within %s; saw %+v", d, seen)
		}
		for _, f := range fs {
			if match(f) {
				return f
			}
		}
		seen = append(seen, fs...)
	}
}

// recoveryField makes GetFieldValues answer the recovery action v.
func recoveryField(v gonvml.DeviceGpuRecoveryAction) func([]gonvml.FieldValue) gonvml.Return {
	return func(vals []gonvml.FieldValue) gonvml.Return {
		for i := range vals {
			if vals[i].FieldId == gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION {
				vals[i].ValueType = uint32(gonvml.VALUE_TYPE_UNSIGNED_INT)
				binary.NativeEndian.PutUint32(vals[i].Value[:], uint32(v))
				vals[i].NvmlReturn = uint32(gonvml.SUCCESS)
			}
		}
		return gonvml.SUCCESS
	}
}

func TestEventClasses(t *testing.T) {
	f := newFixture(t)
	f.gpu(6).GetFieldValuesFunc = recoveryField(gonvml.GPU_RECOVERY_ACTION_GPU_RESET)
	f.gpu(7).GetFieldValuesFunc = recoveryField(gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT)
	w, _ := f.start(t)

	xid := uint64(gonvml.EventTypeXidCriticalError)
	tests := []struct {
		name       string
		gpu        int
		eventType  uint64
		data       uint64
		wantKind   Kind
		wantAction Action
	}{
		{"xid 13 application fault", 0, xid, 13, KindXID, ActionRestartWorkers},
		{"xid 31 page fault", 1, xid, 31, KindXID, ActionRestartWorkers},
		{"xid 43 stopped processing", 2, xid, 43, KindXID, ActionRestartWorkers},
		{"xid 45 cleanup follows others", 2, xid, 45, KindXID, ActionIgnore},
		{"xid 48 double-bit ECC", 3, xid, 48, KindXID, ActionResetGPU},
		{"xid 63 remap pending", 3, xid, 63, KindXID, ActionIgnore},
		{"xid 64 remap failure", 4, xid, 64, KindXID, ActionDrainNode},
		{"xid 74 NVLink", 5, xid, 74, KindXID, ActionResetGPU},
		{"xid 79 off the bus", 5, xid, 79, KindXID, ActionDrainNode},
		{"xid 92 single-bit rate", 0, xid, 92, KindXID, ActionIgnore},
		{"xid 94 contained", 1, xid, 94, KindXID, ActionRestartWorkers},
		{"xid 95 uncontained", 1, xid, 95, KindXID, ActionResetGPU},
		{"xid 109 ctxsw timeout", 2, xid, 109, KindXID, ActionResetGPU},
		{"xid 119 GSP timeout", 3, xid, 119, KindXID, ActionResetGPU},
		{"xid 120 GSP error", 4, xid, 120, KindXID, ActionResetGPU},
		{"xid unknown to NVML", 0, xid, XIDUnknown, KindXID, ActionRestartWorkers},
		{"xid 154 reads the recovery action", 7, xid, 154, KindXID, ActionDrainNode},
		{"xid 154 without the field", 0, xid, 154, KindXID, ActionIgnore},
		{"double-bit ECC event", 3, gonvml.EventTypeDoubleBitEccError, 0, KindECC, ActionResetGPU},
		{"single-bit storm", 3, gonvml.EventTypeSingleBitEccErrorStorm, 0, KindECC, ActionIgnore},
		{"fatal poison", 4, gonvml.EventTypeFatalPoisonError, 0, KindECC, ActionResetGPU},
		{"non-fatal poison", 4, gonvml.EventTypeNonFatalPoisonError, 0, KindECC, ActionRestartWorkers},
		{"DRAM retirement failure", 5, gonvml.EventTypeDramRetirementFailure, 0, KindECC, ActionDrainNode},
		{"GPU unavailable", 6, gonvml.EventTypeGpuUnavailableError, 0, KindUnavailable, ActionDrainNode},
		{"recovery action event", 6, gonvml.EventTypeGpuRecoveryAction, 0, KindRecovery, ActionResetGPU},
		{"event on a GPU not watched", -1, xid, 13, KindXID, ActionRestartWorkers},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			f.inject(t, tc.gpu, tc.eventType, tc.data)
			got := await(t, w, time.Second, func(h Finding) bool {
				return h.Kind == tc.wantKind && h.GPU == tc.gpu && (tc.wantKind != KindXID || h.XID == tc.data)
			})
			if got.Action != tc.wantAction {
				t.Errorf("action %v, want %v (%s)", got.Action, tc.wantAction, got.Message)
			}
			if tc.gpu < 0 {
				if got.Ranks != nil || got.UUID == "" {
					t.Errorf("unwatched GPU: got uuid %q ranks %v, want its uuid and no ranks", got.UUID, got.Ranks)
				}
				return
			}
			if want := f.gpu(tc.gpu).UUID; got.UUID != want {
				t.Errorf("uuid %q, want %q", got.UUID, want)
			}
			if want := []int{tc.gpu, 8 + tc.gpu}; !slices.Equal(got.Ranks, want) {
				t.Errorf("ranks %v, want %v", got.Ranks, want)
			}
			if got.Count != 1 || got.Time.Before(start) || got.Message == "" {
				t.Errorf("finding %+v: want count 1, a time after the injection and a message", got)
			}
			// The line is written before the consumer is woken, but a
			// consumer already awake may drain first: give it a moment.
			uuid := f.gpu(tc.gpu).UUID
			for deadline := time.Now().Add(time.Second); f.log.count("GPU health", "uuid="+uuid) == 0; {
				if time.Now().After(deadline) {
					t.Errorf("no log line names %s", uuid)
					break
				}
				time.Sleep(time.Millisecond)
			}
		})
	}
	if st := w.Stats(); st.Events != uint64(len(tests)) {
		t.Errorf("stats %+v, want %d events", st, len(tests))
	}
}

func TestEventStorm(t *testing.T) {
	// 100 events per second for 2 s, spread over 2 GPUs and 2 XIDs.
	const rate, seconds = 100, 2
	storm := func(t *testing.T, f *fixture) (maxSend time.Duration) {
		tick := time.NewTicker(time.Second / rate)
		defer tick.Stop()
		for i := range rate * seconds {
			<-tick.C
			start := time.Now()
			f.inject(t, i%2, gonvml.EventTypeXidCriticalError, []uint64{13, 31}[(i/2)%2])
			maxSend = max(maxSend, time.Since(start))
		}
		return maxSend
	}
	sum := func(fs []Finding) int {
		n := 0
		for _, f := range fs {
			n += f.Count
		}
		return n
	}

	t.Run("consumer away", func(t *testing.T) {
		f := newFixture(t)
		w, _ := f.start(t)
		maxSend := storm(t, f) // nobody drains during the storm
		// The event loop takes each event as fast as it waits for the next:
		// the consumer's absence never holds it up.
		if maxSend > 500*time.Millisecond {
			t.Errorf("an event waited %s to be taken", maxSend)
		}
		// The last event has been taken; let the loop finish recording it.
		for deadline := time.Now().Add(time.Second); w.Stats().Findings < rate*seconds && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		got := w.Drain()
		if n := sum(got); n != rate*seconds {
			t.Errorf("findings count %d occurrences, want %d", n, rate*seconds)
		}
		if len(got) != 4 {
			t.Errorf("%d findings, want 4 (one per GPU and XID)", len(got))
		}
		if st := w.Stats(); st.Events != rate*seconds || st.Findings != rate*seconds || st.Coalesced != rate*seconds-4 {
			t.Errorf("stats %+v, want %d events and findings, %d coalesced", st, rate*seconds, rate*seconds-4)
		}
		// The log is rate-limited too: one full line per finding per second.
		if n := f.log.count("level=ERROR", "GPU health"); n > 4*(seconds+2) {
			t.Errorf("%d error lines for a %ds storm of 4 distinct findings", n, seconds)
		}
	})

	t.Run("consumer draining", func(t *testing.T) {
		f := newFixture(t)
		w, _ := f.start(t)
		ctx, cancel := context.WithCancel(t.Context())
		var got atomic.Int64
		var wg sync.WaitGroup
		wg.Go(func() {
			for {
				fs, err := w.Next(ctx)
				if err != nil {
					return
				}
				got.Add(int64(sum(fs)))
			}
		})
		storm(t, f)
		deadline := time.Now().Add(time.Second)
		for got.Load() < rate*seconds && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		cancel()
		wg.Wait()
		if n := got.Load(); n != rate*seconds {
			t.Errorf("consumer got %d occurrences, want %d", n, rate*seconds)
		}
	})
}

func TestPeriodic(t *testing.T) {
	const gpu = 2
	tests := []struct {
		name       string
		setup      func(d *dgxa100.Device)
		opts       []Option
		wantKind   Kind
		wantAction Action
		wantText   string
	}{
		{
			name: "retired pages pending",
			setup: func(d *dgxa100.Device) {
				d.GetRetiredPagesPendingStatusFunc = func() (gonvml.EnableState, gonvml.Return) {
					return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
				}
			},
			wantKind: KindMemory, wantAction: ActionIgnore, wantText: "retired pages pending",
		},
		{
			name: "row remapping pending",
			setup: func(d *dgxa100.Device) {
				d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, false, gonvml.SUCCESS }
			},
			wantKind: KindMemory, wantAction: ActionIgnore, wantText: "row remapping pending",
		},
		{
			name: "row remapping failed",
			setup: func(d *dgxa100.Device) {
				d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 3, 9, false, true, gonvml.SUCCESS }
			},
			wantKind: KindMemory, wantAction: ActionDrainNode, wantText: "row remapping failed",
		},
		{
			name: "thermal slowdown",
			setup: func(d *dgxa100.Device) {
				d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
					return gonvml.ClocksThrottleReasonHwThermalSlowdown | gonvml.ClocksEventReasonSwPowerCap, gonvml.SUCCESS
				}
			},
			wantKind: KindClocks, wantAction: ActionIgnore, wantText: "hw-thermal-slowdown",
		},
		{
			name: "hot GPU against its slowdown threshold",
			setup: func(d *dgxa100.Device) {
				d.GetTemperatureThresholdFunc = func(gonvml.TemperatureThresholds) (uint32, gonvml.Return) { return 90, gonvml.SUCCESS }
				d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 86, gonvml.SUCCESS }
			},
			wantKind: KindTemperature, wantAction: ActionIgnore, wantText: "85 °C limit",
		},
		{
			name: "hot GPU against the configured limit",
			setup: func(d *dgxa100.Device) {
				d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 71, gonvml.SUCCESS }
			},
			opts:     []Option{WithTemperatureLimit(70)},
			wantKind: KindTemperature, wantAction: ActionIgnore, wantText: "70 °C limit",
		},
		{
			name:     "NVLink errors grow",
			setup:    nvlinkCounters(10),
			wantKind: KindNVLink, wantAction: ActionIgnore, wantText: "crc-flit +10",
		},
		{
			name:     "NVLink errors grow past the limit",
			setup:    nvlinkCounters(1000),
			wantKind: KindNVLink, wantAction: ActionResetGPU, wantText: "crc-flit +1000",
		},
		{
			name: "NVLink goes down",
			setup: func(d *dgxa100.Device) {
				var polls atomic.Int32
				d.GetNvLinkStateFunc = func(n int) (gonvml.EnableState, gonvml.Return) {
					if n >= 12 {
						return 0, gonvml.ERROR_INVALID_ARGUMENT
					}
					if n == 4 && polls.Add(1) > 1 {
						return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
					}
					return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
				}
				d.GetNvLinkErrorCounterFunc = func(int, gonvml.NvLinkErrorCounter) (uint64, gonvml.Return) { return 0, gonvml.SUCCESS }
			},
			wantKind: KindNVLink, wantAction: ActionResetGPU, wantText: "NVLink down: link 4",
		},
		{
			name: "PCIe replays",
			setup: func(d *dgxa100.Device) {
				var n atomic.Int32
				d.GetPcieReplayCounterFunc = func() (int, gonvml.Return) { return int(n.Add(5)), gonvml.SUCCESS }
			},
			wantKind: KindPCIe, wantAction: ActionIgnore, wantText: "PCIe replays +5",
		},
		{
			name: "recovery action drain and reset",
			setup: func(d *dgxa100.Device) {
				d.GetFieldValuesFunc = recoveryField(gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET)
			},
			wantKind: KindRecovery, wantAction: ActionResetGPU, wantText: "reduced capacity",
		},
		{
			name:     "recovery action drain P2P",
			setup:    func(d *dgxa100.Device) { d.GetFieldValuesFunc = recoveryField(gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P) },
			wantKind: KindRecovery, wantAction: ActionRestartWorkers, wantText: "peer-to-peer",
		},
		{
			name: "GPU lost",
			setup: func(d *dgxa100.Device) {
				d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
			},
			wantKind: KindUnavailable, wantAction: ActionDrainNode, wantText: "GPU is lost",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(f.gpu(gpu))
			w, _ := f.start(t, tc.opts...)
			got := await(t, w, time.Second, func(h Finding) bool { return h.Kind == tc.wantKind })
			if got.GPU != gpu || got.UUID != f.gpu(gpu).UUID || !slices.Equal(got.Ranks, []int{gpu, 8 + gpu}) {
				t.Errorf("finding names GPU %d %s ranks %v, want GPU %d %s ranks [%d %d]",
					got.GPU, got.UUID, got.Ranks, gpu, f.gpu(gpu).UUID, gpu, 8+gpu)
			}
			if got.Action != tc.wantAction || !strings.Contains(got.Message, tc.wantText) {
				t.Errorf("finding %v %q, want %v and %q", got.Action, got.Message, tc.wantAction, tc.wantText)
			}
		})
	}
}

// nvlinkCounters gives a GPU 12 NVLinks whose CRC-flit counter on link 0
// grows by step at every read.
func nvlinkCounters(step uint64) func(d *dgxa100.Device) {
	return func(d *dgxa100.Device) {
		var flit atomic.Uint64
		d.GetNvLinkStateFunc = func(n int) (gonvml.EnableState, gonvml.Return) {
			if n >= 12 {
				return 0, gonvml.ERROR_INVALID_ARGUMENT
			}
			return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
		}
		d.GetNvLinkErrorCounterFunc = func(n int, c gonvml.NvLinkErrorCounter) (uint64, gonvml.Return) {
			switch {
			case c == gonvml.NVLINK_ERROR_DL_ECC_DATA:
				return 0, gonvml.ERROR_NOT_SUPPORTED
			case n == 0 && c == gonvml.NVLINK_ERROR_DL_CRC_FLIT:
				return flit.Add(step), gonvml.SUCCESS
			}
			return 7, gonvml.SUCCESS
		}
	}
}

// A state that persists (pending pages, a hot GPU) is reported when it
// starts, not at every poll.
func TestPeriodicReportsOnce(t *testing.T) {
	f := newFixture(t)
	f.gpu(1).GetRetiredPagesPendingStatusFunc = func() (gonvml.EnableState, gonvml.Return) {
		return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
	}
	f.gpu(1).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 95, gonvml.SUCCESS }
	w, _ := f.start(t)
	time.Sleep(300 * time.Millisecond) // about 15 polls
	got := w.Drain()
	if len(got) != 2 || got[0].Count != 1 || got[1].Count != 1 {
		t.Errorf("findings %+v, want one pending-pages and one temperature finding, once each", got)
	}
}

func TestNotSupportedNotRetried(t *testing.T) {
	f := newFixture(t)
	// The driver lacks the newer clock-event function and row remapping:
	// the watcher must use the older name and never call the missing one.
	f.server.LookupSymbolFunc = func(name string) error {
		if name == symClocksEvent || name == symRemappedRows {
			return errors.New("undefined symbol: " + name)
		}
		return nil
	}
	_, stop := f.start(t)
	time.Sleep(300 * time.Millisecond) // about 15 polls
	if err := stop(); err != nil {
		t.Fatal(err)
	}

	for i := range f.server.Devices {
		d := f.gpu(i)
		calls := []struct {
			name string
			got  int
			want int
		}{
			{"GetFieldValues", len(d.GetFieldValuesCalls()), 1},
			{"GetRetiredPagesPendingStatus", len(d.GetRetiredPagesPendingStatusCalls()), 1},
			{"GetRemappedRows", len(d.GetRemappedRowsCalls()), 0},
			{"GetCurrentClocksEventReasons", len(d.GetCurrentClocksEventReasonsCalls()), 0},
			{"GetCurrentClocksThrottleReasons", len(d.GetCurrentClocksThrottleReasonsCalls()), 1},
			{"GetTemperature", len(d.GetTemperatureCalls()), 1},
			{"GetPcieReplayCounter", len(d.GetPcieReplayCounterCalls()), 1},
			{"GetNvLinkState", len(d.GetNvLinkStateCalls()), gonvml.NVLINK_MAX_LINKS}, // probed once, link by link
		}
		for _, c := range calls {
			if c.got != c.want {
				t.Errorf("GPU %d: %s called %d times, want %d", i, c.name, c.got, c.want)
			}
		}
		// One line per dropped check, not one per poll.
		if n := f.log.count("not supported; dropped", "uuid="+d.UUID); n != 7 {
			t.Errorf("GPU %d: %d 'dropped' lines, want 7:\n%s", i, n, f.log.String())
		}
	}
}

func TestEventRegistration(t *testing.T) {
	f := newFixture(t)
	var registered [8]atomic.Uint64
	for i := range f.server.Devices {
		f.gpu(i).RegisterEventsFunc = func(mask uint64, _ gonvml.EventSet) gonvml.Return {
			registered[i].Or(mask)
			return gonvml.SUCCESS
		}
	}
	// GPU 0 says which events it supports.
	f.gpu(0).GetSupportedEventTypesFunc = func() (uint64, gonvml.Return) {
		return gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypePState, gonvml.SUCCESS
	}
	// GPU 1 refuses any mask holding a type it lacks (NVML then registers
	// nothing), so the watcher registers one type at a time.
	basic := uint64(gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError | gonvml.EventTypeSingleBitEccErrorStorm)
	f.gpu(1).RegisterEventsFunc = func(mask uint64, _ gonvml.EventSet) gonvml.Return {
		if mask&^basic != 0 {
			return gonvml.ERROR_NOT_SUPPORTED
		}
		registered[1].Or(mask)
		return gonvml.SUCCESS
	}
	// GPU 2 has no events at all.
	f.gpu(2).RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.ERROR_NOT_SUPPORTED }
	w, _ := f.start(t)

	f.inject(t, 1, gonvml.EventTypeXidCriticalError, 79)
	got := await(t, w, time.Second, func(h Finding) bool { return h.XID == 79 })
	if got.GPU != 1 || got.Action != ActionDrainNode {
		t.Errorf("finding %+v, want GPU 1 drain-node", got)
	}
	want := []uint64{
		gonvml.EventTypeXidCriticalError | gonvml.EventTypeDoubleBitEccError,
		basic,
		0,
		eventMask,
	}
	for i, w := range want {
		if g := registered[i].Load(); g != w {
			t.Errorf("GPU %d registered %s, want %s", i, eventNames(g), eventNames(w))
		}
	}
	for i := range 3 {
		if n := f.log.count("skipped", "uuid="+f.gpu(i).UUID); n != 1 {
			t.Errorf("GPU %d: %d 'skipped' lines, want 1", i, n)
		}
	}
	if n := f.log.count("skipped", "uuid="+f.gpu(3).UUID); n != 0 {
		t.Errorf("GPU 3 supports every event but got %d 'skipped' lines", n)
	}
}

func TestPollingOnly(t *testing.T) {
	tests := []struct {
		name  string
		setup func(f *fixture)
	}{
		{"no event set", func(f *fixture) {
			f.server.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
		}},
		{"no GPU has events", func(f *fixture) {
			for i := range f.server.Devices {
				f.gpu(i).RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.ERROR_NOT_SUPPORTED }
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(f)
			f.gpu(5).GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) { return 0, 1, true, false, gonvml.SUCCESS }
			w, stop := f.start(t)
			got := await(t, w, time.Second, func(h Finding) bool { return h.Kind == KindMemory })
			if got.GPU != 5 || got.Action != ActionIgnore || !strings.Contains(got.Message, "row remapping pending") {
				t.Errorf("finding %+v, want GPU 5's pending row remapping", got)
			}
			if f.log.count("polling only") != 1 {
				t.Errorf("want one 'polling only' line:\n%s", f.log.String())
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if n := len(f.set.WaitCalls()); n != 0 {
				t.Errorf("Wait called %d times on a set that is not in use", n)
			}
		})
	}
}

func TestRunStops(t *testing.T) {
	t.Run("cancel", func(t *testing.T) {
		f := newFixture(t)
		_, stop := f.start(t)
		time.Sleep(50 * time.Millisecond)
		start := time.Now()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 200*time.Millisecond {
			t.Errorf("Run took %s to return, want about one Wait timeout (20ms)", d)
		}
		if n := f.events.Frees(); n != 1 {
			t.Errorf("event set freed %d times, want 1", n)
		}
	})

	t.Run("stuck wait", func(t *testing.T) {
		f := newFixture(t)
		release := make(chan struct{})
		f.set.WaitFunc = func(uint32) (gonvml.EventData, gonvml.Return) {
			<-release // a driver that never returns
			return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
		}
		w := NewWatcher(f.server, f.devices(), WithLogger(slog.New(slog.NewTextHandler(&f.log, nil))))
		w.stopGrace = 100 * time.Millisecond
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- w.Run(ctx) }()
		time.Sleep(50 * time.Millisecond)
		cancel()
		select {
		case <-done:
		case <-time.After(time.Second):
			t.Fatal("Run did not return within 1s of cancel while Wait hung")
		}
		if f.log.count("has not returned") != 1 {
			t.Errorf("want one line about the stuck call:\n%s", f.log.String())
		}
		close(release) // the driver returns at last: the set is freed then
		deadline := time.Now().Add(time.Second)
		for f.events.Frees() == 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if f.events.Frees() != 1 {
			t.Error("event set not freed after Wait returned")
		}
	})

	t.Run("twice", func(t *testing.T) {
		f := newFixture(t)
		w, _ := f.start(t)
		time.Sleep(10 * time.Millisecond)
		if err := w.Run(t.Context()); err == nil {
			t.Error("second Run succeeded, want an error")
		}
	})
}

func TestWaitErrors(t *testing.T) {
	f := newFixture(t)
	var fails atomic.Int32
	wait := f.set.WaitFunc
	f.set.WaitFunc = func(ms uint32) (gonvml.EventData, gonvml.Return) {
		if fails.Add(1) <= 2 {
			return gonvml.EventData{}, gonvml.ERROR_UNKNOWN
		}
		return wait(ms)
	}
	w, _ := f.start(t)
	f.inject(t, 4, gonvml.EventTypeXidCriticalError, 95)
	got := await(t, w, 2*time.Second, func(h Finding) bool { return h.XID == 95 })
	if got.GPU != 4 || got.Action != ActionResetGPU {
		t.Errorf("finding %+v, want GPU 4 reset-gpu", got)
	}
	if n := f.log.count("event wait failed"); n != 1 {
		t.Errorf("%d 'wait failed' lines for one run of the same error, want 1", n)
	}
	if n := f.log.count("event wait works again"); n != 1 {
		t.Errorf("%d 'works again' lines, want 1", n)
	}
}

// A mock with nothing but UUIDs: every call panics inside go-nvml's mock.
// The watcher must treat that as not supported, not crash.
func TestIncompleteMock(t *testing.T) {
	var devs []gonvml.Device
	for i := range 2 {
		devs = append(devs, &mock.Device{GetUUIDFunc: func() (string, gonvml.Return) { return fmt.Sprintf("GPU-%d", i), gonvml.SUCCESS }})
	}
	lib := &mock.Interface{
		DeviceGetCountFunc: func() (int, gonvml.Return) { return len(devs), gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			return devs[i], gonvml.SUCCESS
		},
	}
	var log logBuffer
	w := NewWatcher(lib, nil, WithLogger(slog.New(slog.NewTextHandler(&log, nil))), WithInterval(10*time.Millisecond))
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := w.Run(ctx); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if n := log.count("uuid=GPU-1", "dropped"); n != 7 {
		t.Errorf("%d checks dropped for GPU-1, want 7:\n%s", n, log.String())
	}
	if got := w.Drain(); len(got) != 0 {
		t.Errorf("findings %+v from a GPU that answers nothing", got)
	}
}

func TestRanksFollowGenerations(t *testing.T) {
	f := newFixture(t)
	w, _ := f.start(t)
	f.inject(t, 3, gonvml.EventTypeXidCriticalError, 13)
	if got := await(t, w, time.Second, func(h Finding) bool { return h.XID == 13 }); !slices.Equal(got.Ranks, []int{3, 11}) {
		t.Errorf("generation 0 ranks %v, want [3 11]", got.Ranks)
	}
	f.setRanks(map[int][]int{3: {19}}) // the next generation put rank 19 on GPU 3
	f.inject(t, 3, gonvml.EventTypeXidCriticalError, 13)
	if got := await(t, w, time.Second, func(h Finding) bool { return h.XID == 13 }); !slices.Equal(got.Ranks, []int{19}) {
		t.Errorf("generation 1 ranks %v, want [19]", got.Ranks)
	}
}

func TestXIDOverride(t *testing.T) {
	f := newFixture(t)
	w, _ := f.start(t, WithXIDActions(map[uint64]Action{63: ActionIgnore, 13: ActionDrainNode}))
	for _, tc := range []struct {
		event uint64
		kind  Kind
		xid   uint64
		want  Action
	}{
		{gonvml.EventTypeXidCriticalError, KindXID, 63, ActionIgnore},
		{gonvml.EventTypeXidCriticalError, KindXID, 13, ActionDrainNode},
		{gonvml.EventTypeDramRetirementEvent, KindECC, 0, ActionIgnore}, // follows Xid 63's action
	} {
		f.inject(t, 0, tc.event, tc.xid)
		got := await(t, w, time.Second, func(h Finding) bool { return h.Kind == tc.kind && h.XID == tc.xid })
		if got.Action != tc.want {
			t.Errorf("%s %d: action %v, want %v", tc.kind, tc.xid, got.Action, tc.want)
		}
	}
}

// A transient error is retried at every poll (logged once), unlike
// NOT_SUPPORTED.
func TestTransientErrorRetried(t *testing.T) {
	f := newFixture(t)
	var calls atomic.Int32
	f.gpu(0).GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) {
		if calls.Add(1) <= 3 {
			return 0, gonvml.ERROR_UNKNOWN
		}
		return 99, gonvml.SUCCESS
	}
	w, _ := f.start(t)
	got := await(t, w, time.Second, func(h Finding) bool { return h.Kind == KindTemperature })
	if got.GPU != 0 || !strings.Contains(got.Message, "99 °C") {
		t.Errorf("finding %+v, want GPU 0 at 99 °C", got)
	}
	uuid := "uuid=" + f.gpu(0).UUID
	if n := f.log.count("check failed; retrying", uuid); n != 1 {
		t.Errorf("%d 'failed' lines for one run of the same error, want 1", n)
	}
	if n := f.log.count("check works again", uuid); n != 1 {
		t.Errorf("%d 'works again' lines, want 1", n)
	}
}

// A consumer that selects on Ready with other channels, as the agent's
// monitor loop does; findings carry the injected clock's time.
func TestReadyDrain(t *testing.T) {
	f := newFixture(t)
	at := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	nvlinkCounters(50)(f.gpu(7))
	w, _ := f.start(t, WithClock(func() time.Time { return at }), WithNVLinkErrorLimit(40))
	timeout := time.After(time.Second)
	for {
		select {
		case <-w.Ready():
		case <-timeout:
			t.Fatal("no NVLink finding within 1s")
		}
		for _, got := range w.Drain() {
			if got.Kind != KindNVLink {
				continue
			}
			if got.Action != ActionResetGPU || !got.Time.Equal(at) || got.GPU != 7 {
				t.Errorf("finding %+v, want GPU 7 reset-gpu (50 errors over a limit of 40) at %v", got, at)
			}
			return
		}
	}
}

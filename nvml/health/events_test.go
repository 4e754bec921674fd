package health

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

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

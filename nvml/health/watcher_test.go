package health

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

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
		w := NewWatcher(nvmltest.Lib(f.server), f.devices(), WithLogger(slog.New(slog.NewTextHandler(&f.log, nil))))
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
	w := NewWatcher(nvmltest.Lib(lib), nil, WithLogger(slog.New(slog.NewTextHandler(&log, nil))), WithInterval(10*time.Millisecond))
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

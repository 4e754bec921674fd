package health

import (
	"context"
	"encoding/binary"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// logBuffer collects what a watcher logs, for tests that count log lines.
type logBuffer struct{ syncbuf.Buffer }

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
	w = NewWatcher(nvmltest.Lib(f.server), f.devices(), opts...)
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

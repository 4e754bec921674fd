package nvmltest_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// TestTelemetry: the knobs change what ReadGPUState sees, also while it
// reads, and a watcher on the quiet DGX A100 with telemetry reports the
// slowdown SetThrottle starts.
func TestTelemetry(t *testing.T) {
	s := nvmltest.DGXA100(true)
	nvmltest.QuietPolls(s)
	tel := nvmltest.NewTelemetry(s)
	uuid := func(i int) string { return s.Devices[i].(*dgxa100.Device).UUID }

	st, err := nvml.ReadGPUState(nvmltest.Lib(s), uuid(6))
	if err != nil || st.String() != "64°C, SM 1410/1410 MHz, 250/400 W, 98% busy" || len(st.Missing) != 0 {
		t.Fatalf("busy GPU6: %q %+v, %v", st, st, err)
	}
	if p := tel.GPU(6).Processes; len(p) != 1 || p[0].Pid != 4106 {
		t.Errorf("GPU6 processes %+v, want the worker with PID 4106", p)
	}

	w := health.NewWatcher(nvmltest.Lib(s), nil,
		health.WithInterval(10*time.Millisecond),
		health.WithLogger(slog.New(slog.DiscardHandler)))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	// Readers while the knobs turn (for the race detector).
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 50 {
				if _, err := nvml.ReadGPUState(nvmltest.Lib(s), uuid(6)); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	tel.SetThrottle(6, gonvml.ClocksThrottleReasonHwSlowdown|gonvml.ClocksThrottleReasonHwThermalSlowdown)
	tel.Update(6, func(g *nvmltest.GPUTelemetry) {
		g.TemperatureC, g.SMClockMHz = 93, 1005
		g.Processes = append(g.Processes, gonvml.ProcessInfo{Pid: 777, UsedGpuMemory: 2 << 30})
	})
	wg.Wait()

	st, err = nvml.ReadGPUState(nvmltest.Lib(s), uuid(6))
	want := "93°C, SM 1005/1410 MHz, 250/400 W, 98% busy, throttled: hw slowdown, hw thermal slowdown, 2 compute processes"
	if err != nil || st.String() != want {
		t.Errorf("throttled GPU6: %q, %v; want %q", st, err, want)
	}

	nctx, ncancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ncancel()
	var found bool
	for !found {
		fs, err := w.Next(nctx)
		if err != nil {
			t.Fatal("no clocks finding for GPU6")
		}
		for _, f := range fs {
			if f.Kind == health.KindClocks && f.GPU == 6 && strings.Contains(f.Message, "hw-thermal-slowdown") {
				found = true
			} else if f.Kind != health.KindTemperature || f.GPU != 6 {
				t.Errorf("unexpected finding %+v", f)
			}
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

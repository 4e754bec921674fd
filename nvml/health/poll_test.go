package health

import (
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// periodicCase is one polled check of TestPeriodic: setup makes GPU 2
// answer as the check should notice, and the finding must have wantKind,
// wantAction and a message that contains wantText.
type periodicCase struct {
	name       string
	setup      func(d *dgxa100.Device)
	opts       []Option
	wantKind   Kind
	wantAction Action
	wantText   string
}

// memoryAndThermalCases are the polled memory, clock and temperature checks.
func memoryAndThermalCases() []periodicCase {
	return []periodicCase{
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
	}
}

// linkAndRecoveryCases are the polled NVLink, PCIe and recovery-action
// checks, and a GPU lost while polling.
func linkAndRecoveryCases() []periodicCase {
	return []periodicCase{
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
}

func TestPeriodic(t *testing.T) {
	const gpu = 2
	tests := append(memoryAndThermalCases(), linkAndRecoveryCases()...)
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

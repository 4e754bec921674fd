package nvml

import (
	"errors"
	"slices"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

// allStateFields is every name GPUState.Missing can hold, in the order
// ReadGPUState reads them.
var allStateFields = []string{stateTemperature, stateSMClock, stateMaxSMClock, statePower, statePowerLimit,
	stateUtilization, stateThrottle, stateProcesses}

// dgxWithTelemetry is a DGX A100 whose GPUs are at work (nvmltest.DGXBusy).
func dgxWithTelemetry() (*dgxa100.Server, *nvmltest.Telemetry) {
	s := nvmltest.DGXA100(true)
	return s, nvmltest.NewTelemetry(s)
}

func dgxUUID(s *dgxa100.Server, i int) string { return s.Devices[i].(*dgxa100.Device).UUID }

// unsupportedTelemetry makes d answer NOT_SUPPORTED to every call
// ReadGPUState makes, as a GPU (or vGPU, or MIG-enabled GPU) that has none
// of them.
func unsupportedTelemetry(d *mock.Device) {
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetMaxClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetPowerManagementLimitFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return gonvml.Utilization{}, gonvml.ERROR_NOT_SUPPORTED }
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
}

// TestReadGPUStateDGX: every field of every GPU of the busy DGX A100.
func TestReadGPUStateDGX(t *testing.T) {
	s, _ := dgxWithTelemetry()
	for i := range s.Devices {
		uuid := dgxUUID(s, i)
		got, err := ReadGPUState(nvmltest.Lib(s), uuid)
		if err != nil {
			t.Fatalf("GPU%d: %v", i, err)
		}
		want := GPUState{UUID: uuid, TemperatureC: 64, SMClockMHz: 1410, MaxSMClockMHz: 1410,
			PowerW: 250, PowerLimitW: 400, UtilizationGPU: 98, Processes: 1}
		if !gpuStateEqual(got, want) {
			t.Errorf("GPU%d: got %+v, want %+v", i, got, want)
		}
		if str, want := got.String(), "64°C, SM 1410/1410 MHz, 250/400 W, 98% busy"; str != want {
			t.Errorf("GPU%d: String() = %q, want %q", i, str, want)
		}
	}
}

// TestReadGPUStateThrottled: a throttled GPU's reasons are named, idle and
// application clocks are not, and the other GPUs stay unthrottled; on a
// driver before R535 the older function gives them.
func TestReadGPUStateThrottled(t *testing.T) {
	for _, tc := range []struct {
		name    string
		reasons uint64
		want    []string
	}{
		{"thermal", gonvml.ClocksEventReasonSwThermalSlowdown | gonvml.ClocksThrottleReasonHwSlowdown |
			gonvml.ClocksThrottleReasonHwThermalSlowdown, []string{"hw slowdown", "sw thermal slowdown", "hw thermal slowdown"}},
		{"power cap", gonvml.ClocksEventReasonSwPowerCap, []string{"sw power cap"}},
		{"power brake", gonvml.ClocksThrottleReasonHwSlowdown | gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown,
			[]string{"hw slowdown", "hw power brake"}},
		{"sync boost and display", gonvml.ClocksEventReasonSyncBoost | gonvml.ClocksEventReasonDisplayClockSetting,
			[]string{"sync boost", "display clock setting"}},
		{"idle and app clocks are not throttling", gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksEventReasonApplicationsClocksSetting, nil},
		{"idle with power cap", gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksEventReasonSwPowerCap, []string{"sw power cap"}},
		{"unknown bit", gonvml.ClocksEventReasonSwPowerCap | 0x1000, []string{"sw power cap", "reason 0x1000"}},
	} {
		for _, older := range []bool{false, true} {
			name := tc.name
			if older {
				name += "/R530"
			}
			t.Run(name, func(t *testing.T) {
				s, tel := dgxWithTelemetry()
				if older {
					s.LookupSymbolFunc = func(sym string) error {
						if sym == "nvmlDeviceGetCurrentClocksEventReasons" {
							return errors.New("undefined symbol: " + sym)
						}
						return nil
					}
					for i := range s.Devices {
						s.Devices[i].(*dgxa100.Device).GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) {
							t.Error("nvmlDeviceGetCurrentClocksEventReasons called; the driver lacks it")
							return 0, gonvml.ERROR_FUNCTION_NOT_FOUND
						}
					}
				}
				tel.SetThrottle(3, tc.reasons)
				got, err := ReadGPUState(nvmltest.Lib(s), dgxUUID(s, 3))
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got.ThrottleReasons, tc.want) || len(got.Missing) != 0 {
					t.Errorf("GPU3: reasons %q, missing %q; want %q and none", got.ThrottleReasons, got.Missing, tc.want)
				}
				other, err := ReadGPUState(nvmltest.Lib(s), dgxUUID(s, 2))
				if err != nil || len(other.ThrottleReasons) != 0 {
					t.Errorf("GPU2: %+v, %v; want unthrottled", other, err)
				}
			})
		}
	}
}

// TestReadGPUStateMissing: what NVML cannot read is named in Missing and is
// no error, whether NVML says not supported, the GPU is lost, or a mock
// has no function for it (which panics).
func TestReadGPUStateMissing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		setup func(d *dgxa100.Device)
		want  GPUState // UUID filled in below
		str   string
	}{
		{
			name:  "all not supported",
			setup: func(d *dgxa100.Device) { unsupportedTelemetry(&d.Device) },
			want:  GPUState{Processes: -1, Missing: allStateFields},
		},
		{
			name:  "no telemetry funcs in the mock",
			setup: func(*dgxa100.Device) {},
			want:  GPUState{Processes: -1, Missing: allStateFields},
		},
		{
			name: "GPU lost",
			setup: func(d *dgxa100.Device) {
				unsupportedTelemetry(&d.Device)
				d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_GPU_IS_LOST }
			},
			want: GPUState{Processes: -1, Missing: allStateFields},
		},
		{
			name: "power and processes not supported",
			setup: func(d *dgxa100.Device) {
				nvmltest.AttachTelemetry([]gonvml.Device{d}, nvmltest.DGXBusy())
				d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
				d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return nil, gonvml.ERROR_NOT_SUPPORTED }
			},
			want: GPUState{TemperatureC: 64, SMClockMHz: 1410, MaxSMClockMHz: 1410, PowerLimitW: 400, UtilizationGPU: 98,
				Processes: -1, Missing: []string{statePower, stateProcesses}},
			str: "64°C, SM 1410/1410 MHz, 98% busy",
		},
		{
			name: "older driver: management limit, no max clock",
			setup: func(d *dgxa100.Device) {
				nvmltest.AttachTelemetry([]gonvml.Device{d}, nvmltest.DGXBusy())
				d.GetEnforcedPowerLimitFunc = nil // panics: taken as missing
				d.GetMaxClockInfoFunc = func(gonvml.ClockType) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
			},
			want: GPUState{TemperatureC: 64, SMClockMHz: 1410, PowerW: 250, PowerLimitW: 400, UtilizationGPU: 98,
				Processes: 1, Missing: []string{stateMaxSMClock}},
			str: "64°C, SM 1410 MHz, 250/400 W, 98% busy",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := nvmltest.DGXA100(true)
			d := s.Devices[5].(*dgxa100.Device)
			tc.setup(d)
			got, err := ReadGPUState(nvmltest.Lib(s), d.UUID)
			if err != nil {
				t.Fatalf("error %v, want none", err)
			}
			want := tc.want
			want.UUID = d.UUID
			if !gpuStateEqual(got, want) {
				t.Errorf("got %+v, want %+v", got, want)
			}
			if str := got.String(); str != tc.str {
				t.Errorf("String() = %q, want %q", str, tc.str)
			}
		})
	}
}

// TestReadGPUStateNotFound: a GPU that cannot be found is an error, not a
// panic, whatever the library does about it.
func TestReadGPUStateNotFound(t *testing.T) {
	box := nvmltest.NewPCIeBox() // no DeviceGetHandleByUUIDFunc: the call panics
	for _, tc := range []struct {
		name string
		lib  gonvml.Interface
		uuid string
		is   error
	}{
		{"unknown UUID", nvmltest.DGXA100(true), nvmltest.UnwatchedUUID, gonvml.ERROR_INVALID_ARGUMENT},
		{"empty UUID", nvmltest.DGXA100(true), "", gonvml.ERROR_INVALID_ARGUMENT},
		{"no lookup by UUID in the mock", box.Lib, box.GPUs[0].UUID, gonvml.ERROR_FUNCTION_NOT_FOUND},
		{"nil handle", &mock.Interface{DeviceGetHandleByUUIDFunc: func(string) (gonvml.Device, gonvml.Return) {
			return nil, gonvml.SUCCESS
		}}, "GPU-x", gonvml.ERROR_NOT_FOUND},
		{"no library", nil, "GPU-x", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadGPUState(nvmltest.Lib(tc.lib), tc.uuid)
			if err == nil {
				t.Fatalf("got %+v, no error", got)
			}
			if tc.is != nil && !errors.Is(err, tc.is) {
				t.Errorf("error %v, want one that is %v", err, tc.is)
			}
		})
	}
}

func TestGPUStateString(t *testing.T) {
	full := GPUState{UUID: "GPU-1", TemperatureC: 64, SMClockMHz: 1410, MaxSMClockMHz: 1410, PowerW: 250, PowerLimitW: 400,
		UtilizationGPU: 98, ThrottleReasons: []string{"sw power cap"}, Processes: 1}
	with := func(f func(*GPUState)) GPUState {
		s := full
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		s    GPUState
		want string
	}{
		{"full", full, "64°C, SM 1410/1410 MHz, 250/400 W, 98% busy, throttled: sw power cap"},
		{"not throttled", with(func(s *GPUState) { s.ThrottleReasons = nil }), "64°C, SM 1410/1410 MHz, 250/400 W, 98% busy"},
		{"hot and clocked down", with(func(s *GPUState) {
			s.TemperatureC, s.SMClockMHz, s.PowerW, s.UtilizationGPU = 91, 1095, 249.6, 100
			s.ThrottleReasons = []string{"hw slowdown", "sw thermal slowdown"}
		}), "91°C, SM 1095/1410 MHz, 250/400 W, 100% busy, throttled: hw slowdown, sw thermal slowdown"},
		{"idle is 0% busy", with(func(s *GPUState) { s.UtilizationGPU, s.ThrottleReasons = 0, nil }),
			"64°C, SM 1410/1410 MHz, 250/400 W, 0% busy"},
		{"shared GPU", with(func(s *GPUState) { s.Processes = 3 }),
			"64°C, SM 1410/1410 MHz, 250/400 W, 98% busy, throttled: sw power cap, 3 compute processes"},
		{"no processes", with(func(s *GPUState) { s.Processes = 0 }),
			"64°C, SM 1410/1410 MHz, 250/400 W, 98% busy, throttled: sw power cap"},
		{"missing parts", with(func(s *GPUState) {
			s.TemperatureC, s.PowerW, s.PowerLimitW, s.Processes = 0, 0, 0, -1
			s.Missing = []string{stateTemperature, statePower, statePowerLimit, stateProcesses}
		}), "SM 1410/1410 MHz, 98% busy, throttled: sw power cap"},
		{"no max clock, no limit", with(func(s *GPUState) {
			s.MaxSMClockMHz, s.PowerLimitW = 0, 0
			s.Missing = []string{stateMaxSMClock, statePowerLimit}
		}), "64°C, SM 1410 MHz, 250 W, 98% busy, throttled: sw power cap"},
		{"no current clock or power", with(func(s *GPUState) {
			s.SMClockMHz, s.PowerW = 0, 0
			s.Missing = []string{stateSMClock, statePower}
		}), "64°C, 98% busy, throttled: sw power cap"},
		{"nothing", GPUState{UUID: "GPU-1", Processes: -1, Missing: allStateFields}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.String(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

func gpuStateEqual(a, b GPUState) bool {
	return a.UUID == b.UUID && a.TemperatureC == b.TemperatureC && a.SMClockMHz == b.SMClockMHz &&
		a.MaxSMClockMHz == b.MaxSMClockMHz && a.PowerW == b.PowerW && a.PowerLimitW == b.PowerLimitW &&
		a.UtilizationGPU == b.UtilizationGPU && slices.Equal(a.ThrottleReasons, b.ThrottleReasons) &&
		a.Processes == b.Processes && slices.Equal(a.Missing, b.Missing)
}

// TestGPUStateSlowdown: only what slows a busy GPU is evidence; an idle
// GPU's low clocks and a field NVML could not read are not.
func TestGPUStateSlowdown(t *testing.T) {
	healthy := GPUState{UUID: "GPU-1", TemperatureC: 64, SMClockMHz: 1410, MaxSMClockMHz: 1410, UtilizationGPU: 98, Processes: 1}
	with := func(f func(*GPUState)) GPUState {
		s := healthy
		f(&s)
		return s
	}
	for _, tc := range []struct {
		name string
		s    GPUState
		want string
	}{
		{"healthy", healthy, ""},
		{"throttled and clocked down", with(func(s *GPUState) {
			s.SMClockMHz, s.ThrottleReasons = 900, []string{"hw thermal slowdown"}
		}), "throttled: hw thermal slowdown; SM clock 900 of 1410 MHz while 98% busy"},
		{"idle GPU clocks down by design", with(func(s *GPUState) { s.SMClockMHz, s.UtilizationGPU = 210, 3 }), ""},
		{"slightly below max", with(func(s *GPUState) { s.SMClockMHz = 1200 }), ""},
		{"clock unknown", with(func(s *GPUState) { s.SMClockMHz, s.Missing = 0, []string{stateSMClock} }), ""},
		{"shared", with(func(s *GPUState) { s.Processes = 3 }), "shared with 2 other compute processes"},
		{"processes unknown", with(func(s *GPUState) { s.Processes = -1 }), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.s.Slowdown(); got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}

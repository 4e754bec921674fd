package nvmltest

import (
	"fmt"
	"slices"
	"sync"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// GPUTelemetry is what one mock GPU answers to the telemetry calls:
// temperature, clocks, power, utilization, clock event reasons and
// compute processes.
type GPUTelemetry struct {
	TemperatureC  uint32 // nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)
	SMClockMHz    uint32 // nvmlDeviceGetClockInfo(NVML_CLOCK_SM), and NVML_CLOCK_GRAPHICS
	MaxSMClockMHz uint32 // nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM), and NVML_CLOCK_GRAPHICS
	PowerMW       uint32 // nvmlDeviceGetPowerUsage, in milliwatts
	PowerLimitMW  uint32 // nvmlDeviceGetEnforcedPowerLimit and ...GetPowerManagementLimit, in milliwatts
	Utilization   gonvml.Utilization
	// ClocksEventReasons is the mask of nvmlDeviceGetCurrentClocksEventReasons
	// and of its older name, ...GetCurrentClocksThrottleReasons.
	ClocksEventReasons uint64
	Processes          []gonvml.ProcessInfo // nvmlDeviceGetComputeRunningProcesses
}

// DGXBusy is a DGX A100 GPU (A100-SXM4-40GB) in the middle of a training
// step: 64 °C, SM clock at its 1410 MHz maximum, 250 of 400 W, 98% busy
// (memory 45%), no clock event reason, and one compute process (the
// rank's worker, PID 4100, 30 GiB).
func DGXBusy() GPUTelemetry {
	return GPUTelemetry{
		TemperatureC:  64,
		SMClockMHz:    1410,
		MaxSMClockMHz: 1410,
		PowerMW:       250_000,
		PowerLimitMW:  400_000,
		Utilization:   gonvml.Utilization{Gpu: 98, Memory: 45},
		Processes:     []gonvml.ProcessInfo{worker(4100)},
	}
}

// worker is a training worker's compute process: 30 GiB, not in a MIG
// instance.
func worker(pid uint32) gonvml.ProcessInfo {
	return gonvml.ProcessInfo{Pid: pid, UsedGpuMemory: 30 << 30, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
}

// Telemetry is the live state of a mock machine's GPUs as NVML's telemetry
// calls report it. A test changes a GPU's state with SetThrottle or Update
// while the code under test reads it; all its methods are safe for
// concurrent use.
type Telemetry struct {
	mu   sync.Mutex
	gpus []GPUTelemetry
}

// NewTelemetry attaches telemetry to the DGX A100 s (DGXA100 or a bare
// dgxa100.New) with AttachTelemetry: every GPU starts as DGXBusy, GPU i's
// worker with PID 4100+i.
//
// The health watcher polls two of these calls (temperature and clock event
// reasons): call QuietPolls before NewTelemetry, not after, which would
// set them back to NOT_SUPPORTED. A watcher then sees the telemetry: a
// slowdown reason set with SetThrottle becomes a clocks finding.
func NewTelemetry(s *dgxa100.Server) *Telemetry {
	t := AttachTelemetry(s.Devices[:], DGXBusy())
	for i := range t.gpus {
		t.gpus[i].Processes = []gonvml.ProcessInfo{worker(4100 + uint32(i))}
	}
	return t
}

// AttachTelemetry sets the telemetry calls of each of devs (a
// *mock.Device or a *dgxa100.Device; GPU i is devs[i]) to answer from the
// returned Telemetry, where every GPU starts as base. Clock types other
// than SM and graphics, and temperature sensors other than the GPU's,
// answer NOT_SUPPORTED. A test may set one of these funcs again afterwards
// (to answer NOT_SUPPORTED, say).
func AttachTelemetry(devs []gonvml.Device, base GPUTelemetry) *Telemetry {
	t := &Telemetry{gpus: make([]GPUTelemetry, len(devs))}
	for i, dev := range devs {
		t.gpus[i] = base
		t.gpus[i].Processes = slices.Clone(base.Processes)
		d := mockDevice(dev)
		d.GetTemperatureFunc = func(s gonvml.TemperatureSensors) (uint32, gonvml.Return) {
			if s != gonvml.TEMPERATURE_GPU {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return t.GPU(i).TemperatureC, gonvml.SUCCESS
		}
		d.GetClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
			if c != gonvml.CLOCK_SM && c != gonvml.CLOCK_GRAPHICS {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return t.GPU(i).SMClockMHz, gonvml.SUCCESS
		}
		d.GetMaxClockInfoFunc = func(c gonvml.ClockType) (uint32, gonvml.Return) {
			if c != gonvml.CLOCK_SM && c != gonvml.CLOCK_GRAPHICS {
				return 0, gonvml.ERROR_NOT_SUPPORTED
			}
			return t.GPU(i).MaxSMClockMHz, gonvml.SUCCESS
		}
		d.GetPowerUsageFunc = func() (uint32, gonvml.Return) { return t.GPU(i).PowerMW, gonvml.SUCCESS }
		d.GetEnforcedPowerLimitFunc = func() (uint32, gonvml.Return) { return t.GPU(i).PowerLimitMW, gonvml.SUCCESS }
		d.GetPowerManagementLimitFunc = func() (uint32, gonvml.Return) { return t.GPU(i).PowerLimitMW, gonvml.SUCCESS }
		d.GetUtilizationRatesFunc = func() (gonvml.Utilization, gonvml.Return) { return t.GPU(i).Utilization, gonvml.SUCCESS }
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return t.GPU(i).ClocksEventReasons, gonvml.SUCCESS }
		d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) { return t.GPU(i).ClocksEventReasons, gonvml.SUCCESS }
		d.GetComputeRunningProcessesFunc = func() ([]gonvml.ProcessInfo, gonvml.Return) { return t.GPU(i).Processes, gonvml.SUCCESS }
	}
	return t
}

// ThrottleSwPowerCap is the clock event reason "sw power cap"
// (ClocksThrottleReasonSwPowerCap), for SetThrottle from tests that do not
// import go-nvml.
const ThrottleSwPowerCap uint64 = gonvml.ClocksThrottleReasonSwPowerCap

// ThrottleHwSlowdown is the clock event reason "hw slowdown".
const ThrottleHwSlowdown uint64 = gonvml.ClocksThrottleReasonHwSlowdown

// SetThrottle sets GPU gpu's active clock event reasons (a mask of
// nvml.ClocksEventReason* and nvml.ClocksThrottleReason* bits; 0 for
// none). It leaves the clocks as they are: lower SMClockMHz with Update
// for a GPU that is slowed down as well as flagged.
func (t *Telemetry) SetThrottle(gpu int, reasons uint64) {
	t.Update(gpu, func(g *GPUTelemetry) { g.ClocksEventReasons = reasons })
}

// Update changes GPU gpu's state with f, under the Telemetry's lock; f
// must not call t's methods. It panics when there is no GPU gpu.
func (t *Telemetry) Update(gpu int, f func(*GPUTelemetry)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.check(gpu)
	f(&t.gpus[gpu])
}

// GPU returns GPU gpu's state (a copy). It panics when there is no GPU gpu.
func (t *Telemetry) GPU(gpu int) GPUTelemetry {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.check(gpu)
	g := t.gpus[gpu]
	g.Processes = slices.Clone(g.Processes)
	return g
}

func (t *Telemetry) check(gpu int) {
	if gpu < 0 || gpu >= len(t.gpus) {
		panic(fmt.Sprintf("nvmltest: telemetry of GPU %d: there are %d", gpu, len(t.gpus)))
	}
}

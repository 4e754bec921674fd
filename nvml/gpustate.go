package nvml

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// GPUState is what NVML says about one GPU right now, for telling why a
// rank is slow: is its GPU hot, throttled, clocked down, or busy with
// another job? Fields NVML could not read are left zero (Processes -1) and
// named in Missing, by field name ("TemperatureC", "PowerW", ...).
type GPUState struct {
	UUID          string  `json:"uuid"`
	TemperatureC  uint32  `json:"temperature_c"`
	SMClockMHz    uint32  `json:"sm_clock_mhz"`
	MaxSMClockMHz uint32  `json:"max_sm_clock_mhz"`
	PowerW        float64 `json:"power_w"`
	PowerLimitW   float64 `json:"power_limit_w"` // the enforced limit
	// UtilizationGPU is the percentage of the last sample period (1/6 s
	// to 1 s, by product) in which a kernel was running.
	UtilizationGPU uint32 `json:"utilization_gpu_percent"`
	// ThrottleReasons names the active clock event (throttle) reasons, in
	// NVML's bit order: "sw power cap", "hw slowdown", "sync boost", "sw
	// thermal slowdown", "hw thermal slowdown", "hw power brake", "display
	// clock setting", and "reason 0x..." for a bit newer than go-nvml
	// v0.13.0-1. "gpu idle" and "applications clocks setting" are left
	// out: they are not slowdowns. Empty when none is active.
	ThrottleReasons []string `json:"throttle_reasons,omitempty"`
	// Processes counts the compute processes on the GPU: more than the
	// rank's own worker means other work shares it. -1 when unknown.
	Processes int      `json:"processes"`
	Missing   []string `json:"missing,omitempty"`
}

// The names in GPUState.Missing.
const (
	stateTemperature = "TemperatureC"
	stateSMClock     = "SMClockMHz"
	stateMaxSMClock  = "MaxSMClockMHz"
	statePower       = "PowerW"
	statePowerLimit  = "PowerLimitW"
	stateUtilization = "UtilizationGPU"
	stateThrottle    = "ThrottleReasons"
	stateProcesses   = "Processes"
)

// throttleReasonNames names the clock event reasons GPUState reports, in
// bit order. go-nvml v0.13.0-1 has the hardware ones only under their
// older ClocksThrottleReason names.
var throttleReasonNames = []struct {
	bit  uint64
	name string
}{
	{gonvml.ClocksEventReasonSwPowerCap, "sw power cap"},
	{gonvml.ClocksThrottleReasonHwSlowdown, "hw slowdown"},
	{gonvml.ClocksEventReasonSyncBoost, "sync boost"},
	{gonvml.ClocksEventReasonSwThermalSlowdown, "sw thermal slowdown"},
	{gonvml.ClocksThrottleReasonHwThermalSlowdown, "hw thermal slowdown"},
	{gonvml.ClocksThrottleReasonHwPowerBrakeSlowdown, "hw power brake"},
	{gonvml.ClocksEventReasonDisplayClockSetting, "display clock setting"},
}

// notThrottled are the clock event reasons that are not slowdowns: an idle
// GPU, and clocks an administrator set.
const notThrottled uint64 = gonvml.ClocksEventReasonGpuIdle | gonvml.ClocksEventReasonApplicationsClocksSetting

// throttleNames names the reasons in mask, those in notThrottled left out.
func throttleNames(mask uint64) []string {
	mask &^= notThrottled
	var names []string
	for _, r := range throttleReasonNames {
		if mask&r.bit != 0 {
			names = append(names, r.name)
			mask &^= r.bit
		}
	}
	for m := mask; m != 0; m &= m - 1 {
		names = append(names, fmt.Sprintf("reason 0x%x", m&-m))
	}
	return names
}

// ReadGPUState reads the state of the GPU with the given UUID from l,
// which the caller has initialized. Each NVML call that fails (not
// supported on this GPU or driver, GPU lost, a mock without the function)
// only leaves its field zero and names it in Missing; the error is for a
// GPU that cannot be found or opened.
//
// It makes about ten NVML calls, each of which may block for as long as
// the driver takes (long when the GPU is in trouble), and cannot be
// interrupted. It is safe for concurrent use. The clock event reasons come
// from nvmlDeviceGetCurrentClocksEventReasons, or from its older name,
// ...ClocksThrottleReasons, on drivers before R535.
func ReadGPUState(l *Lib, uuid string) (GPUState, error) {
	lib := nvmlapi.Unwrap(l)
	if lib == nil {
		return GPUState{}, errors.New("read GPU state: no NVML library")
	}
	dev, ret := nvmlapi.Call(func() (gonvml.Device, gonvml.Return) { return lib.DeviceGetHandleByUUID(uuid) })
	if ret == gonvml.SUCCESS && dev == nil {
		ret = gonvml.ERROR_NOT_FOUND
	}
	if ret != gonvml.SUCCESS {
		return GPUState{}, fmt.Errorf("read state of GPU %s: %w", uuid, ret)
	}

	s := GPUState{UUID: uuid, Processes: -1}
	ok := func(field string, ret gonvml.Return) bool {
		if ret != gonvml.SUCCESS {
			s.Missing = append(s.Missing, field)
			return false
		}
		return true
	}
	if v, ret := nvmlapi.Call(func() (uint32, gonvml.Return) { return dev.GetTemperature(gonvml.TEMPERATURE_GPU) }); ok(stateTemperature, ret) {
		s.TemperatureC = v
	}
	if v, ret := nvmlapi.Call(func() (uint32, gonvml.Return) { return dev.GetClockInfo(gonvml.CLOCK_SM) }); ok(stateSMClock, ret) {
		s.SMClockMHz = v
	}
	if v, ret := nvmlapi.Call(func() (uint32, gonvml.Return) { return dev.GetMaxClockInfo(gonvml.CLOCK_SM) }); ok(stateMaxSMClock, ret) {
		s.MaxSMClockMHz = v
	}
	if mw, ret := nvmlapi.Call(dev.GetPowerUsage); ok(statePower, ret) {
		s.PowerW = float64(mw) / 1000
	}
	mw, ret := nvmlapi.Call(dev.GetEnforcedPowerLimit)
	if ret != gonvml.SUCCESS {
		mw, ret = nvmlapi.Call(dev.GetPowerManagementLimit)
	}
	if ok(statePowerLimit, ret) {
		s.PowerLimitW = float64(mw) / 1000
	}
	if u, ret := nvmlapi.Call(dev.GetUtilizationRates); ok(stateUtilization, ret) {
		s.UtilizationGPU = u.Gpu
	}
	if mask, ret := clockEventReasons(lib, dev); ok(stateThrottle, ret) {
		s.ThrottleReasons = throttleNames(mask)
	}
	if ps, ret := nvmlapi.Call(dev.GetComputeRunningProcesses); ok(stateProcesses, ret) {
		s.Processes = len(ps)
	}
	return s, nil
}

// NVML's function for the clock event reasons (R535 and newer), and its
// older name.
const (
	symClocksEvent    = "nvmlDeviceGetCurrentClocksEventReasons"
	symClocksThrottle = "nvmlDeviceGetCurrentClocksThrottleReasons"
)

// clockEventReasons reads the active clock event reasons under the name
// the driver has: calling a function the loaded library lacks would kill
// the process (see nvmlapi.HasSymbol).
func clockEventReasons(lib gonvml.Interface, dev gonvml.Device) (uint64, gonvml.Return) {
	mask, ret := uint64(0), gonvml.ERROR_FUNCTION_NOT_FOUND
	if nvmlapi.HasSymbol(lib, symClocksEvent) {
		mask, ret = nvmlapi.Call(dev.GetCurrentClocksEventReasons)
	}
	if ret == gonvml.ERROR_FUNCTION_NOT_FOUND && nvmlapi.HasSymbol(lib, symClocksThrottle) {
		mask, ret = nvmlapi.Call(dev.GetCurrentClocksThrottleReasons)
	}
	return mask, ret
}

// String is s in one short line for a report: "64°C, SM 1410/1410 MHz,
// 250/400 W, 98% busy, throttled: sw power cap". A part whose field is in
// Missing is left out (a clock or power without its maximum or limit is
// shown alone), as is "throttled" when no reason is active; "3 compute
// processes" is added when more than one shares the GPU. "" when nothing
// could be read.
func (s GPUState) String() string {
	has := func(field string) bool { return !slices.Contains(s.Missing, field) }
	var parts []string
	if has(stateTemperature) {
		parts = append(parts, fmt.Sprintf("%d°C", s.TemperatureC))
	}
	switch {
	case has(stateSMClock) && has(stateMaxSMClock):
		parts = append(parts, fmt.Sprintf("SM %d/%d MHz", s.SMClockMHz, s.MaxSMClockMHz))
	case has(stateSMClock):
		parts = append(parts, fmt.Sprintf("SM %d MHz", s.SMClockMHz))
	}
	switch {
	case has(statePower) && has(statePowerLimit):
		parts = append(parts, fmt.Sprintf("%.0f/%.0f W", s.PowerW, s.PowerLimitW))
	case has(statePower):
		parts = append(parts, fmt.Sprintf("%.0f W", s.PowerW))
	}
	if has(stateUtilization) {
		parts = append(parts, fmt.Sprintf("%d%% busy", s.UtilizationGPU))
	}
	if len(s.ThrottleReasons) > 0 {
		parts = append(parts, "throttled: "+strings.Join(s.ThrottleReasons, ", "))
	}
	if s.Processes > 1 {
		parts = append(parts, fmt.Sprintf("%d compute processes", s.Processes))
	}
	return strings.Join(parts, ", ")
}

// slowClockShare: an SM clock below this share of its maximum, on a GPU
// that is busy, is running slow (an idle GPU lowers its clocks by design).
const (
	slowClockShare = 0.8
	busyPercent    = 50
)

// Slowdown is what in s would make a rank on this GPU compute slower than
// its peers, in one short clause ("throttled: hw thermal slowdown; SM
// 900/1980 MHz"), or "" when NVML shows nothing of the kind: an active
// throttle reason, an SM clock well below its maximum while the GPU is
// busy, or other compute processes sharing it. It is the evidence behind a
// straggler's cause "gpu"; a field NVML could not read is no evidence.
func (s GPUState) Slowdown() string {
	has := func(field string) bool { return !slices.Contains(s.Missing, field) }
	var parts []string
	if len(s.ThrottleReasons) > 0 {
		parts = append(parts, "throttled: "+strings.Join(s.ThrottleReasons, ", "))
	}
	if has(stateSMClock) && has(stateMaxSMClock) && has(stateUtilization) && s.MaxSMClockMHz > 0 &&
		s.UtilizationGPU >= busyPercent && float64(s.SMClockMHz) < slowClockShare*float64(s.MaxSMClockMHz) {
		parts = append(parts, fmt.Sprintf("SM clock %d of %d MHz while %d%% busy", s.SMClockMHz, s.MaxSMClockMHz, s.UtilizationGPU))
	}
	if s.Processes > 1 {
		parts = append(parts, fmt.Sprintf("shared with %d other compute processes", s.Processes-1))
	}
	return strings.Join(parts, "; ")
}

package nvmltest

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// UnwatchedUUID is the UUID of the GPU that Events.Inject names for a
// negative gpu: one the library does not list.
const UnwatchedUUID = "GPU-ffffffff-0000-0000-0000-00000000dead"

// Events is an NVML event set fed by a test. Its channel is unbuffered:
// Inject completes only when the set's Wait takes the event, so a test
// knows the watcher has it.
type Events struct {
	// Set is the mock event set EventSetCreate returns, every time. A test
	// may replace (or wrap) Set.WaitFunc before the set is in use, and
	// read Set.WaitCalls.
	Set *mock.EventSet

	devs      []gonvml.Device
	ch        chan gonvml.EventData
	frees     atomic.Int32
	unwatched gonvml.Device
}

// NewEvents attaches an event set to the DGX A100 s (DGXA100 or a bare
// dgxa100.New) with AttachEvents.
func NewEvents(s *dgxa100.Server) *Events {
	return AttachEvents(&s.Interface, s.Devices[:])
}

// AttachEvents gives lib an event set fed by Inject: lib's
// EventSetCreateFunc returns it, and each of devs (the handles lib gives
// out, index by index; each a *mock.Device or a *dgxa100.Device) accepts
// any registration. GetSupportedEventTypes stays as it was: unset on the
// mocks, it panics, which nvml's watcher takes as not supported and then
// registers every event it wants. A test may set a device's
// RegisterEventsFunc again afterwards, to refuse some.
func AttachEvents(lib *mock.Interface, devs []gonvml.Device) *Events {
	e := &Events{
		devs: devs,
		ch:   make(chan gonvml.EventData),
		unwatched: &mock.Device{
			GetUUIDFunc: func() (string, gonvml.Return) { return UnwatchedUUID, gonvml.SUCCESS },
		},
	}
	e.Set = &mock.EventSet{
		WaitFunc: func(ms uint32) (gonvml.EventData, gonvml.Return) {
			return e.wait(ms)
		},
		FreeFunc: func() gonvml.Return { e.frees.Add(1); return gonvml.SUCCESS },
	}
	lib.EventSetCreateFunc = func() (gonvml.EventSet, gonvml.Return) { return e.Set, gonvml.SUCCESS }
	for _, d := range devs {
		mockDevice(d).RegisterEventsFunc = func(uint64, gonvml.EventSet) gonvml.Return { return gonvml.SUCCESS }
	}
	return e
}

// wait is the set's Wait: the next injected event, or ERROR_TIMEOUT after
// ms milliseconds, as nvmlEventSetWait_v2.
func (e *Events) wait(ms uint32) (gonvml.EventData, gonvml.Return) {
	timer := time.NewTimer(time.Duration(ms) * time.Millisecond)
	defer timer.Stop()
	select {
	case ev := <-e.ch:
		return ev, gonvml.SUCCESS
	case <-timer.C:
		return gonvml.EventData{}, gonvml.ERROR_TIMEOUT
	}
}

// EventXID is NVML's XID event type (EventTypeXidCriticalError), for
// Inject from tests that do not import go-nvml.
const EventXID uint64 = gonvml.EventTypeXidCriticalError

// Inject delivers one event on GPU gpu (an index into the devices; a
// negative gpu names a GPU the library does not list, with UUID
// UnwatchedUUID) through the set's Wait. The event is not a MIG one (GPU
// and compute instance ids 0xFFFFFFFF); for an XID, eventType is EventXID
// and data the XID. It returns when a Wait has taken the event, or ctx's
// error if none does first.
func (e *Events) Inject(ctx context.Context, gpu int, eventType, data uint64) error {
	if gpu >= len(e.devs) {
		return fmt.Errorf("nvmltest: inject on GPU %d: there are %d", gpu, len(e.devs))
	}
	ev := gonvml.EventData{EventType: eventType, EventData: data, GpuInstanceId: 0xFFFFFFFF, ComputeInstanceId: 0xFFFFFFFF}
	if gpu >= 0 {
		ev.Device = e.devs[gpu]
	} else {
		ev.Device = e.unwatched
	}
	select {
	case e.ch <- ev:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("nvmltest: event %#x (data %d) on GPU %d not taken: %w", eventType, data, gpu, ctx.Err())
	}
}

// Frees counts the calls to the set's Free.
func (e *Events) Frees() int { return int(e.frees.Load()) }

// QuietPolls makes every polled health check of nvml's watcher answer
// NOT_SUPPORTED on each GPU of s (QuietDevice), so a watcher on the mock
// is silent until a test injects an event or sets a device's func to
// answer otherwise.
func QuietPolls(s *dgxa100.Server) {
	for _, d := range s.Devices {
		QuietDevice(mockDevice(d))
	}
}

// QuietDevice makes d answer NOT_SUPPORTED to the calls nvml's health
// watcher polls: field values (the GPU recovery action), retired pages,
// remapped rows, clock event (throttle) reasons, temperature and its
// thresholds, NVLink error counters and PCIe replays. GetNvLinkState keeps
// an answer already set (DGXA100's twelve active links stay up, so the
// watcher sees steady links whose counters it cannot read) and answers
// NOT_SUPPORTED otherwise.
func QuietDevice(d *mock.Device) {
	d.GetFieldValuesFunc = func([]gonvml.FieldValue) gonvml.Return { return gonvml.ERROR_NOT_SUPPORTED }
	d.GetRetiredPagesPendingStatusFunc = func() (gonvml.EnableState, gonvml.Return) {
		return gonvml.FEATURE_DISABLED, gonvml.ERROR_NOT_SUPPORTED
	}
	d.GetRemappedRowsFunc = func() (int, int, bool, bool, gonvml.Return) {
		return 0, 0, false, false, gonvml.ERROR_NOT_SUPPORTED
	}
	d.GetCurrentClocksEventReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetCurrentClocksThrottleReasonsFunc = func() (uint64, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetTemperatureFunc = func(gonvml.TemperatureSensors) (uint32, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	d.GetTemperatureThresholdFunc = func(gonvml.TemperatureThresholds) (uint32, gonvml.Return) {
		return 0, gonvml.ERROR_NOT_SUPPORTED
	}
	if d.GetNvLinkStateFunc == nil {
		d.GetNvLinkStateFunc = func(int) (gonvml.EnableState, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
	}
	d.GetNvLinkErrorCounterFunc = func(int, gonvml.NvLinkErrorCounter) (uint64, gonvml.Return) {
		return 0, gonvml.ERROR_NOT_SUPPORTED
	}
	d.GetPcieReplayCounterFunc = func() (int, gonvml.Return) { return 0, gonvml.ERROR_NOT_SUPPORTED }
}

// mockDevice is the go-nvml mock under a handle.
func mockDevice(d gonvml.Device) *mock.Device {
	switch d := d.(type) {
	case *mock.Device:
		return d
	case *dgxa100.Device:
		return &d.Device
	}
	panic(fmt.Sprintf("nvmltest: %T is not a go-nvml mock device", d))
}

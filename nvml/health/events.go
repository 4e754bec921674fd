package health

import (
	"context"
	"fmt"
	"strings"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// eventMask is the NVML events the watcher registers for. Single-bit
// ECC errors are corrected and left out (a storm of them is its own event);
// P-state, clock, power-source and MIG-change events are not health.
const eventMask uint64 = gonvml.EventTypeXidCriticalError |
	gonvml.EventTypeDoubleBitEccError |
	gonvml.EventTypeSingleBitEccErrorStorm |
	gonvml.EventTypeDramRetirementEvent |
	gonvml.EventTypeDramRetirementFailure |
	gonvml.EventTypeNonFatalPoisonError |
	gonvml.EventTypeFatalPoisonError |
	gonvml.EventTypeGpuUnavailableError |
	gonvml.EventTypeGpuRecoveryAction

var eventTypeNames = map[uint64]string{
	gonvml.EventTypeXidCriticalError:       "xid",
	gonvml.EventTypeDoubleBitEccError:      "ecc-dbe",
	gonvml.EventTypeSingleBitEccErrorStorm: "ecc-sbe-storm",
	gonvml.EventTypeDramRetirementEvent:    "dram-retirement",
	gonvml.EventTypeDramRetirementFailure:  "dram-retirement-failure",
	gonvml.EventTypeNonFatalPoisonError:    "poison",
	gonvml.EventTypeFatalPoisonError:       "fatal-poison",
	gonvml.EventTypeGpuUnavailableError:    "gpu-unavailable",
	gonvml.EventTypeGpuRecoveryAction:      "recovery-action",
}

// eventNames spells an event-type mask, "xid,ecc-dbe".
func eventNames(mask uint64) string {
	var names []string
	for m := mask; m != 0; m &= m - 1 {
		bit := m & -m
		if n, ok := eventTypeNames[bit]; ok {
			names = append(names, n)
		} else {
			names = append(names, fmt.Sprintf("0x%x", bit))
		}
	}
	return strings.Join(names, ",")
}

// register makes the event set and registers every GPU's events, skipping
// what a GPU does not support. It returns nil when no GPU has any event.
func (w *Watcher) register(gpus []*watchedGPU) gonvml.EventSet {
	set, ret := nvmlapi.Call(w.lib.EventSetCreate)
	if ret != gonvml.SUCCESS || set == nil {
		w.logger.Warn("GPU health watcher: NVML events unavailable; polling only", "err", ret.Error())
		return nil
	}
	anyEvents := false
	for _, g := range gpus {
		want := eventMask
		if sup, ret := nvmlapi.Call(g.dev.GetSupportedEventTypes); ret == gonvml.SUCCESS {
			want &= sup
		}
		got := w.registerGPU(g, set, want)
		if skipped := eventMask &^ got; skipped != 0 {
			w.logger.Info("GPU health watcher: NVML events not supported by this GPU; skipped",
				"gpu", g.Index, "uuid", g.UUID, "skipped", eventNames(skipped), "registered", eventNames(got))
		}
		anyEvents = anyEvents || got != 0
	}
	if !anyEvents {
		w.logger.Warn("GPU health watcher: no GPU supports the NVML events; polling only")
		nvmlapi.CallRet(set.Free)
		return nil
	}
	return set
}

// registerGPU registers want for g, all at once and, when NVML refuses the
// mask (it then registers none of it), one type at a time. It returns what
// was registered.
func (w *Watcher) registerGPU(g *watchedGPU, set gonvml.EventSet, want uint64) uint64 {
	if want == 0 {
		return 0
	}
	ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.RegisterEvents(want, set) })
	switch ret {
	case gonvml.SUCCESS:
		return want
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT:
	case gonvml.ERROR_GPU_IS_LOST:
		w.markLost(g, "register events")
		return 0
	default:
		w.logger.Warn("GPU health watcher: register NVML events; trying one type at a time",
			"gpu", g.Index, "uuid", g.UUID, "events", eventNames(want), "err", ret.Error())
	}
	var got uint64
	for m := want; m != 0; m &= m - 1 {
		bit := m & -m
		ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.RegisterEvents(bit, set) })
		switch ret {
		case gonvml.SUCCESS:
			got |= bit
		case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_FUNCTION_NOT_FOUND:
		default:
			w.logger.Warn("GPU health watcher: register NVML event", "gpu", g.Index, "uuid", g.UUID,
				"event", eventNames(bit), "err", ret.Error())
		}
	}
	return got
}

// eventLoop waits on set until ctx is done, then frees it. Wait errors
// other than the timeout back off (up to 5s) and are logged once per run
// of the same error.
func (w *Watcher) eventLoop(ctx context.Context, set gonvml.EventSet, gpus []*watchedGPU) {
	defer func() {
		if ret := nvmlapi.CallRet(set.Free); ret != gonvml.SUCCESS {
			w.logger.Warn("GPU health watcher: free NVML event set", "err", ret.Error())
		}
	}()
	ms := uint32(max(w.waitTimeout/time.Millisecond, 1))
	lastErr := gonvml.SUCCESS
	var backoff time.Duration
	for ctx.Err() == nil {
		data, ret := nvmlapi.Call(func() (gonvml.EventData, gonvml.Return) { return set.Wait(ms) })
		switch ret {
		case gonvml.SUCCESS, gonvml.ERROR_TIMEOUT:
			if lastErr != gonvml.SUCCESS {
				w.logger.Info("GPU health watcher: NVML event wait works again")
				lastErr, backoff = gonvml.SUCCESS, 0
			}
			if ret == gonvml.SUCCESS {
				w.handleEvent(data, gpus)
			}
			continue
		}
		if ret != lastErr {
			w.logger.Warn("GPU health watcher: NVML event wait failed; retrying", "err", ret.Error())
			lastErr = ret
		}
		backoff = min(max(2*backoff, 100*time.Millisecond), 5*time.Second)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
}

// handleEvent turns one NVML event into a finding.
func (w *Watcher) handleEvent(data gonvml.EventData, gpus []*watchedGPU) {
	w.mu.Lock()
	w.stats.Events++
	w.mu.Unlock()
	g := w.gpuOf(data.Device, gpus)
	et := data.EventType
	switch {
	case et&gonvml.EventTypeXidCriticalError != 0:
		w.xidFinding(g, data)
	case et&gonvml.EventTypeDoubleBitEccError != 0:
		w.record(g, KindECC, 0, w.xidAction(48), "double-bit (uncorrectable) ECC error; a GPU reset clears it (as Xid 48)")
	case et&gonvml.EventTypeFatalPoisonError != 0:
		w.record(g, KindECC, 0, w.xidAction(95), "fatal poison error: uncontained memory error (as Xid 95)")
	case et&gonvml.EventTypeNonFatalPoisonError != 0:
		w.record(g, KindECC, 0, w.xidAction(94), "non-fatal poison error: contained memory error (as Xid 94)")
	case et&gonvml.EventTypeDramRetirementFailure != 0:
		w.record(g, KindECC, 0, w.xidAction(64), "DRAM retirement (row remapping) failed (as Xid 64)")
	case et&gonvml.EventTypeDramRetirementEvent != 0:
		w.record(g, KindECC, 0, w.xidAction(63), "DRAM retirement (row remapping) pending until GPU reset (as Xid 63)")
	case et&gonvml.EventTypeSingleBitEccErrorStorm != 0:
		w.record(g, KindECC, 0, w.xidAction(92), "single-bit ECC error storm (corrected; as Xid 92)")
	case et&gonvml.EventTypeGpuUnavailableError != 0:
		w.record(g, KindUnavailable, 0, ActionDrainNode, "GPU unavailable")
	case et&gonvml.EventTypeGpuRecoveryAction != 0:
		a, desc, ok := w.readRecovery(g)
		if !ok {
			w.record(g, KindRecovery, 0, ActionIgnore, "GPU recovery action changed; NVML does not say to what")
			return
		}
		w.record(g, KindRecovery, 0, a, "GPU recovery action: "+desc)
	default:
		w.record(g, KindECC, 0, ActionIgnore, fmt.Sprintf("NVML event type 0x%x", et))
	}
}

// xidFinding records an XID event.
func (w *Watcher) xidFinding(g *watchedGPU, data gonvml.EventData) {
	x := XIDClassify(data.EventData)
	action := w.xidAction(x.Code)
	msg := fmt.Sprintf("Xid %d %s: %s", x.Code, x.Mnemonic, x.Description)
	if data.GpuInstanceId != 0xFFFFFFFF {
		msg += fmt.Sprintf(" (MIG GPU instance %d, compute instance %d)", data.GpuInstanceId, data.ComputeInstanceId)
	}
	if x.Code == 154 {
		if a, desc, ok := w.readRecovery(g); ok {
			action = a
			msg += "; recovery action: " + desc
		}
	}
	w.record(g, KindXID, x.Code, action, msg)
}

// xidAction is the action for code, overrides first.
func (w *Watcher) xidAction(code uint64) Action {
	if a, ok := w.xidActions[code]; ok {
		return a
	}
	return XIDClassify(code).Action
}

// gpuOf finds the watched GPU an event names, by handle, then by UUID.
func (w *Watcher) gpuOf(dev gonvml.Device, gpus []*watchedGPU) *watchedGPU {
	if dev == nil {
		return &watchedGPU{Device: Device{Index: -1}}
	}
	for _, g := range gpus {
		if sameDevice(g.dev, dev) {
			return g
		}
	}
	uuid, _ := nvmlapi.Call(dev.GetUUID)
	for _, g := range gpus {
		if uuid != "" && g.UUID == uuid {
			return g
		}
	}
	return &watchedGPU{Device: Device{Index: -1, UUID: uuid}}
}

// sameDevice compares two handles; handles of a type that cannot be
// compared are not the same.
func sameDevice(a, b gonvml.Device) (same bool) {
	defer func() {
		if recover() != nil {
			same = false
		}
	}()
	return a == b
}

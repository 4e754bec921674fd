package health

import (
	"encoding/binary"
	"fmt"
	"math"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// pollRecovery reads the driver's GPU recovery action and records a change
// to anything but "none".
func (w *Watcher) pollRecovery(g *watchedGPU) {
	if !w.have(symFieldValues) {
		w.drop(g, checkRecovery, symFieldValues+" not in this driver")
		return
	}
	v, ret := w.recoveryValue(g)
	if !w.ok(g, checkRecovery, ret) {
		return
	}
	old := g.recovery.Swap(int64(v))
	switch {
	case old == int64(v):
	case v != uint64(gonvml.GPU_RECOVERY_ACTION_NONE):
		a, desc := recoveryAction(v)
		w.record(g, KindRecovery, 0, a, "GPU recovery action: "+desc)
	case old >= 0:
		w.logger.Info("GPU health: recovery action back to none", "gpu", g.Index, "uuid", g.UUID)
	}
}

// readRecovery reads the recovery action for an event (Xid 154,
// EventTypeGpuRecoveryAction). ok is false when it cannot be read.
func (w *Watcher) readRecovery(g *watchedGPU) (a Action, desc string, ok bool) {
	if g.dev == nil || !w.have(symFieldValues) {
		return ActionIgnore, "", false
	}
	v, ret := w.recoveryValue(g)
	if ret != gonvml.SUCCESS {
		return ActionIgnore, "", false
	}
	g.recovery.Store(int64(v))
	a, desc = recoveryAction(v)
	return a, desc, true
}

// recoveryValue reads NVML_FI_DEV_GET_GPU_RECOVERY_ACTION.
func (w *Watcher) recoveryValue(g *watchedGPU) (uint64, gonvml.Return) {
	vals := []gonvml.FieldValue{{FieldId: gonvml.FI_DEV_GET_GPU_RECOVERY_ACTION}}
	if ret := nvmlapi.CallRet(func() gonvml.Return { return g.dev.GetFieldValues(vals) }); ret != gonvml.SUCCESS {
		return 0, ret
	}
	if ret := gonvml.Return(vals[0].NvmlReturn); ret != gonvml.SUCCESS {
		return 0, ret
	}
	return fieldUint(vals[0]), gonvml.SUCCESS
}

// fieldUint decodes an integer field value.
func fieldUint(f gonvml.FieldValue) uint64 {
	b := f.Value[:]
	switch gonvml.ValueType(f.ValueType) {
	case gonvml.VALUE_TYPE_DOUBLE:
		return uint64(math.Float64frombits(binary.NativeEndian.Uint64(b)))
	case gonvml.VALUE_TYPE_UNSIGNED_INT, gonvml.VALUE_TYPE_SIGNED_INT:
		return uint64(binary.NativeEndian.Uint32(b))
	case gonvml.VALUE_TYPE_UNSIGNED_SHORT:
		return uint64(binary.NativeEndian.Uint16(b))
	default:
		return binary.NativeEndian.Uint64(b)
	}
}

// recoveryAction maps the driver's recovery action (nvmlDeviceGpuRecoveryAction_t)
// to ours. Meanings from NVIDIA, "A100 GPU Memory Error Management", "Error
// Recovery and Response Flags": reset → reset; node reboot → drain; drain
// P2P ("terminate related processes"; asked again, the driver then names
// the next step) → restart the workers; drain and reset (reduced capacity;
// running work is safe) → reset. Values newer than v0.13.0-1 (IMEX domain
// recovery, PCIe bus reset, system reboot) are beyond a GPU reset: drain.
func recoveryAction(v uint64) (Action, string) {
	switch gonvml.DeviceGpuRecoveryAction(v) {
	case gonvml.GPU_RECOVERY_ACTION_NONE:
		return ActionIgnore, "none"
	case gonvml.GPU_RECOVERY_ACTION_GPU_RESET:
		return ActionResetGPU, "GPU reset required"
	case gonvml.GPU_RECOVERY_ACTION_NODE_REBOOT:
		return ActionDrainNode, "node reboot required"
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_P2P:
		return ActionRestartWorkers, "drain peer-to-peer traffic (stop the processes using the GPU)"
	case gonvml.GPU_RECOVERY_ACTION_DRAIN_AND_RESET:
		return ActionResetGPU, "reduced capacity: drain the work and reset the GPU"
	}
	return ActionDrainNode, fmt.Sprintf("recovery action %d (unknown to ddp-agent)", v)
}

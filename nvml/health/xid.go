package health

import (
	"maps"
	"slices"
)

// XIDInfo describes one XID: NVIDIA's mnemonic and description, the
// immediate action NVIDIA's XID catalog recommends ("Resolution Bucket
// (Immediate Action)"), and the action ddp-agent takes.
type XIDInfo struct {
	Code        uint64 `json:"code"`
	Mnemonic    string `json:"mnemonic"`
	Description string `json:"description"`
	NVIDIA      string `json:"nvidia_action"` // the catalog's immediate-action bucket, "" where it has none
	Action      Action `json:"action"`
}

// XIDUnknown is the code NVML reports in an XID event when the driver's XID
// is unknown to it (nvml.h, nvmlEventData_t.eventData).
const XIDUnknown = 999

// XIDLookup returns the catalog entry of code, and false when ddp-agent does
// not know the code.
func XIDLookup(code uint64) (XIDInfo, bool) {
	x, ok := xidTable[code]
	if ok {
		x.Code = code
	}
	return x, ok
}

// XIDClassify returns the catalog entry of code, or for an unknown code an
// entry named UNKNOWN with ActionRestartWorkers.
//
// Why restart for an unknown XID: an XID is by definition an error the
// driver raised against a GPU channel, and most XIDs in NVIDIA's catalog
// (every engine exception, every page fault) cost the process that owned the
// channel its CUDA context, with RESTART_APP as the remedy. Restarting the
// workers is the least disruptive action that gets training going again in
// that case. Resetting the GPU or draining the node on no evidence would
// take a healthy node down; a GPU that really is broken makes the restarted
// workers fail again, which the restart budget (--max-restarts) bounds, and
// the driver's own recovery action (Xid 154, EventTypeGpuRecoveryAction)
// escalates where a reset or reboot is required.
func XIDClassify(code uint64) XIDInfo {
	if x, ok := XIDLookup(code); ok {
		return x
	}
	desc := "XID not in ddp-agent's catalog"
	if code == XIDUnknown {
		desc = "XID unknown to NVML"
	}
	return XIDInfo{Code: code, Mnemonic: "UNKNOWN", Description: desc, Action: ActionRestartWorkers}
}

// XIDCatalog returns every XID ddp-agent knows, sorted by code.
func XIDCatalog() []XIDInfo {
	out := make([]XIDInfo, 0, len(xidTable))
	for _, code := range slices.Sorted(maps.Keys(xidTable)) {
		x, _ := XIDLookup(code)
		out = append(out, x)
	}
	return out
}

// xidTable maps XID codes to their meaning and action. It is read-only.
//
// Sources:
//   - [catalog] NVIDIA, "Analyzing Xid Errors with the Xid Catalog" (Ampere
//     and newer), https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html:
//     mnemonic, description and the "Resolution Bucket (Immediate Action)"
//     quoted in NVIDIA below;
//   - [archive] NVIDIA, "Xid and SXid Errors with the Xid Catalog for older
//     GPUs", https://docs.nvidia.com/deploy/xid-errors/archive/index.html, for
//     codes the catalog marks unused on Ampere and newer (56, 57, 61, 73);
//   - [memerr] NVIDIA, "A100 GPU Memory Error Management", section "Error
//     Recovery and Response Flags", https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/,
//     for row remapping (63, 64) and the GPU recovery action (154);
//   - [dpr] NVIDIA, "Dynamic Page Retirement",
//     https://docs.nvidia.com/deploy/dynamic-page-retirement/, for 48/63/64
//     on GPUs before Ampere.
//
// How the buckets map to actions: RESTART_APP → ActionRestartWorkers;
// RESET_GPU → ActionResetGPU; RESTART_BM, RESTART_VM, CHECK_MECHANICALS and
// anything that needs a reboot or a technician → ActionDrainNode; IGNORE →
// ActionIgnore. Where ddp-agent departs from the bucket, the entry says why.
var xidTable = map[uint64]XIDInfo{
	8:  {Mnemonic: "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", Description: "GPU stopped processing", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	11: {Mnemonic: "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", Description: "Invalid or corrupted push buffer stream", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 13: "typically an out-of-bounds error where the user has walked past
	// the end of an array" [catalog]: an application fault.
	13: {Mnemonic: "ROBUST_CHANNEL_GR_EXCEPTION", Description: "Graphics Engine Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	14: {Mnemonic: "ROBUST_CHANNEL_FAKE_ERROR", Description: "Fake or injected error from userspace", NVIDIA: "IGNORE", Action: ActionIgnore},
	25: {Mnemonic: "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", Description: "Invalid or illegal push buffer stream", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 31: an MMU fault, "typically application-level bugs" [catalog].
	31: {Mnemonic: "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", Description: "GPU memory page fault", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	32: {Mnemonic: "ROBUST_CHANNEL_PBDMA_ERROR", Description: "Invalid or corrupted push buffer stream (DMA controller fault, often PCIe quality)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	37: {Mnemonic: "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", Description: "Driver firmware error", NVIDIA: "IGNORE", Action: ActionIgnore},
	38: {Mnemonic: "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", Description: "Driver firmware error", NVIDIA: "IGNORE", Action: ActionIgnore},
	39: {Mnemonic: "ROBUST_CHANNEL_CE0_ERROR", Description: "Copy Engine Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	40: {Mnemonic: "ROBUST_CHANNEL_CE1_ERROR", Description: "Copy Engine Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	41: {Mnemonic: "ROBUST_CHANNEL_CE2_ERROR", Description: "Copy Engine Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 43: "logged when a user application hits a software induced fault and
	// must terminate. The GPU remains in a healthy state" [catalog]. IGNORE
	// is about the GPU; the process that hit it is dead, and in DDP one dead
	// rank stalls every other rank, so the worker group restarts.
	43: {Mnemonic: "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", Description: "GPU stopped processing (application fault; the application must terminate)", NVIDIA: "IGNORE", Action: ActionRestartWorkers},
	44: {Mnemonic: "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", Description: "Graphics Engine fault during context switch", NVIDIA: "IGNORE", Action: ActionIgnore},
	// 45: follows other errors, and is also "logged when the user
	// application aborts ... Control-C, GPU resets, sigkill" [catalog], which
	// includes the agent stopping its own workers. Not solo: IGNORE, follow
	// the other Xid; solo: RESTART_FM (Fabric Manager, not the agent's to
	// restart).
	45: {Mnemonic: "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", Description: "Preemptive cleanup, due to previous errors", NVIDIA: "WORKFLOW_XID_45", Action: ActionIgnore},
	46: {Mnemonic: "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", Description: "GPU stopped processing", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 48: "A GPU reset or node reboot is needed to clear this error"
	// [catalog]; [dpr].
	48: {Mnemonic: "ROBUST_CHANNEL_GPU_ECC_DBE", Description: "Double Bit ECC Error", NVIDIA: "WORKFLOW_XID_48", Action: ActionResetGPU},
	54: {Mnemonic: "SILENT_RUNNING_PWR_REDUCED_CLOCKING", Description: "Auxiliary power is not connected to the GPU board", NVIDIA: "CHECK_MECHANICALS", Action: ActionDrainNode},
	// 56, 57, 61, 73: unused on Ampere and newer [catalog]; meanings from
	// [archive]. A display error does not touch compute work.
	56: {Mnemonic: "DISPLAY_CHANNEL_EXCEPTION", Description: "Display Engine error (GPUs before Ampere)", Action: ActionIgnore},
	57: {Mnemonic: "FB_LINK_TRAINING_FAILURE_ERROR", Description: "Error programming video memory interface (GPUs before Ampere; hardware)", Action: ActionResetGPU},
	60: {Mnemonic: "ROBUST_CHANNEL_SEC2_ERROR", Description: "Video processor exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	61: {Mnemonic: "PMU_BREAKPOINT", Description: "Internal micro-controller breakpoint/warning (GPUs before Ampere)", Action: ActionResetGPU},
	62: {Mnemonic: "PMU_HALT_ERROR", Description: "Internal micro-controller halt", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 63: a row (Ampere+) or page (older) was marked for remapping; it takes
	// effect at the next GPU reset ("Row Remapper: New row marked for
	// remapping, reset gpu to activate", [memerr], [dpr]). The catalog's
	// IGNORE is because running applications are unaffected. The agent's
	// answer to ActionResetGPU is to leave the job, which would stop a
	// healthy job for a repair that can wait for its end, so the finding
	// is a warning; a 48 that comes with it asks for the reset anyway.
	63: {Mnemonic: "INFOROM_DRAM_RETIREMENT_EVENT", Description: "GPU memory remapping event (pending until the GPU is reset)", NVIDIA: "IGNORE", Action: ActionIgnore},
	// 64: remapping (or page retirement) failed; a failure is an RMA
	// condition ([memerr], "RMA Policy Thresholds for Row-Remapping"). The
	// catalog's immediate RESET_GPU does not repair it (investigatory:
	// CONTACT_SUPPORT), and the same memory fails again, so drain.
	64: {Mnemonic: "INFOROM_DRAM_RETIREMENT_FAILURE", Description: "GPU memory remapping failure", NVIDIA: "RESET_GPU", Action: ActionDrainNode},
	66: {Mnemonic: "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", Description: "Illegal access by driver", NVIDIA: "IGNORE", Action: ActionIgnore},
	67: {Mnemonic: "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", Description: "Illegal access by driver", NVIDIA: "IGNORE", Action: ActionIgnore},
	68: {Mnemonic: "ROBUST_CHANNEL_NVDEC0_ERROR", Description: "NVDEC0 Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	69: {Mnemonic: "ROBUST_CHANNEL_GR_CLASS_ERROR", Description: "Graphics Engine class error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	70: {Mnemonic: "ROBUST_CHANNEL_CE3_ERROR", Description: "Copy Engine Exception (CE3)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	71: {Mnemonic: "ROBUST_CHANNEL_CE4_ERROR", Description: "Copy Engine Exception (CE4)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	72: {Mnemonic: "ROBUST_CHANNEL_CE5_ERROR", Description: "Copy Engine Exception (CE5)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	73: {Mnemonic: "ROBUST_CHANNEL_NVENC2_ERROR", Description: "NVENC2 Error (GPUs before Ampere)", Action: ActionRestartWorkers},
	// 74: "A GPU reset or node reboot is needed to clear this error"; the
	// fault may be at the remote end of the link [catalog].
	74: {Mnemonic: "NVLINK_ERROR", Description: "NVLINK Error", NVIDIA: "WORKFLOW_NVLINK_ERR", Action: ActionResetGPU},
	75: {Mnemonic: "ROBUST_CHANNEL_CE6_ERROR", Description: "Copy Engine Exception (CE6)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	76: {Mnemonic: "ROBUST_CHANNEL_CE7_ERROR", Description: "Copy Engine Exception (CE7)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	77: {Mnemonic: "ROBUST_CHANNEL_CE8_ERROR", Description: "Copy Engine Exception (CE8)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 79: RESTART_BM is a reboot of the bare-metal node.
	79: {Mnemonic: "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", Description: "GPU has fallen off the bus", NVIDIA: "RESTART_BM", Action: ActionDrainNode},
	80: {Mnemonic: "PBDMA_PUSHBUFFER_CRC_MISMATCH", Description: "Corrupted data sent to GPU", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	82: {Mnemonic: "ROBUST_CHANNEL_NVJPG0_ERROR", Description: "NVJPG0 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	83: {Mnemonic: "ROBUST_CHANNEL_NVDEC1_ERROR", Description: "NVDEC1 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	84: {Mnemonic: "ROBUST_CHANNEL_NVDEC2_ERROR", Description: "NVDEC2 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	85: {Mnemonic: "ROBUST_CHANNEL_CE9_ERROR", Description: "Copy Engine Exception (CE9)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	86: {Mnemonic: "ROBUST_CHANNEL_OFA0_ERROR", Description: "OFA Exception", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 92: corrected errors; the memory keeps working.
	92: {Mnemonic: "EXCESSIVE_SBE_INTERRUPTS", Description: "High single-bit ECC error rate", NVIDIA: "IGNORE", Action: ActionIgnore},
	93: {Mnemonic: "INFOROM_ERASE_LIMIT_EXCEEDED", Description: "Non-fatal violation of provisioned InfoROM wear limit", NVIDIA: "IGNORE", Action: ActionIgnore},
	// 94: "contained to one application, and the application that
	// encountered this error must be restarted. All other applications ...
	// are unaffected. It is recommended to reset the GPU when convenient"
	// [catalog].
	94: {Mnemonic: "ROBUST_CHANNEL_CONTAINED_ERROR", Description: "Contained memory error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 95: "the affected GPU must be reset before applications can restart"
	// [catalog].
	95:  {Mnemonic: "ROBUST_CHANNEL_UNCONTAINED_ERROR", Description: "Uncontained memory error", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	96:  {Mnemonic: "ROBUST_CHANNEL_NVDEC5_ERROR", Description: "NVDEC5 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	97:  {Mnemonic: "ROBUST_CHANNEL_NVDEC6_ERROR", Description: "NVDEC6 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	98:  {Mnemonic: "ROBUST_CHANNEL_NVDEC7_ERROR", Description: "NVDEC7 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	99:  {Mnemonic: "ROBUST_CHANNEL_NVJPG1_ERROR", Description: "NVJPG1 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	100: {Mnemonic: "ROBUST_CHANNEL_NVJPG2_ERROR", Description: "NVJPG2 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	101: {Mnemonic: "ROBUST_CHANNEL_NVJPG3_ERROR", Description: "NVJPG3 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	102: {Mnemonic: "ROBUST_CHANNEL_NVJPG4_ERROR", Description: "NVJPG4 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	103: {Mnemonic: "ROBUST_CHANNEL_NVJPG5_ERROR", Description: "NVJPG5 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	104: {Mnemonic: "ROBUST_CHANNEL_NVJPG6_ERROR", Description: "NVJPG6 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	105: {Mnemonic: "ROBUST_CHANNEL_NVJPG7_ERROR", Description: "NVJPG7 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	106: {Mnemonic: "SMBPBI_TEST_MESSAGE", Description: "SMBPBI Test Message", NVIDIA: "IGNORE", Action: ActionIgnore},
	107: {Mnemonic: "SMBPBI_TEST_MESSAGE_SILENT", Description: "SMBPBI Test Message Silent", NVIDIA: "IGNORE", Action: ActionIgnore},
	// 109: the catalog asks for a GPU reset, not only an application restart.
	109: {Mnemonic: "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", Description: "Context Switch Timeout Error", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 110: "To recover, revert any recent system hardware modifications and
	// cold reset the system" [catalog]: a node matter.
	110: {Mnemonic: "SEC_FAULT_ERROR", Description: "Security Fault Error", NVIDIA: "RESET_GPU", Action: ActionDrainNode},
	// 119, 120: "A GPU reset or node power cycle may be needed if the error
	// persists" [catalog].
	119: {Mnemonic: "GSP_RPC_TIMEOUT", Description: "GSP RPC Timeout", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	120: {Mnemonic: "GSP_ERROR", Description: "GSP Error", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 121: corrected C2C errors, "no operational impact" [catalog].
	121: {Mnemonic: "C2C_ERROR", Description: "C2C Error (corrected)", NVIDIA: "IGNORE", Action: ActionIgnore},
	126: {Mnemonic: "ROBUST_CHANNEL_CE10_ERROR", Description: "Copy Engine Exception (CE10)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	127: {Mnemonic: "ROBUST_CHANNEL_CE11_ERROR", Description: "Copy Engine Exception (CE11)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	128: {Mnemonic: "ROBUST_CHANNEL_CE12_ERROR", Description: "Copy Engine Exception (CE12)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	129: {Mnemonic: "ROBUST_CHANNEL_CE13_ERROR", Description: "Copy Engine Exception (CE13)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	130: {Mnemonic: "ROBUST_CHANNEL_CE14_ERROR", Description: "Copy Engine Exception (CE14)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	131: {Mnemonic: "ROBUST_CHANNEL_CE15_ERROR", Description: "Copy Engine Exception (CE15)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	132: {Mnemonic: "ROBUST_CHANNEL_CE16_ERROR", Description: "Copy Engine Exception (CE16)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	133: {Mnemonic: "ROBUST_CHANNEL_CE17_ERROR", Description: "Copy Engine Exception (CE17)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	134: {Mnemonic: "ROBUST_CHANNEL_CE18_ERROR", Description: "Copy Engine Exception (CE18)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	135: {Mnemonic: "ROBUST_CHANNEL_CE19_ERROR", Description: "Copy Engine Exception (CE19)", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	136: {Mnemonic: "ALI_TRAINING_FAIL", Description: "Link Training Failed", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 137: an illegal NVLink peer-to-peer access, "typically ...
	// application-level bugs" [catalog], the NVLink counterpart of 31. The
	// GPU is fine (IGNORE) but the faulting process is not: restart.
	137: {Mnemonic: "NVLINK_PRIV_ERR", Description: "NVLink Privilege Error", NVIDIA: "IGNORE", Action: ActionRestartWorkers},
	139: {Mnemonic: "ROBUST_CHANNEL_OFA1_ERROR", Description: "OFA1 Error", NVIDIA: "RESTART_APP", Action: ActionRestartWorkers},
	// 140: "Reset the GPU, and if the problem persists, contact your
	// hardware vendor" [catalog].
	140: {Mnemonic: "UNRECOVERABLE_ECC_ERROR_ESCAPE", Description: "ECC Unrecovered Error", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	141: {Mnemonic: "ROBUST_CHANNEL_FAST_PATH_ERROR", Description: "CUDA Fast Path Error", NVIDIA: "IGNORE", Action: ActionIgnore},
	143: {Mnemonic: "GPU_INIT_ERROR", Description: "GPU Initialization Error", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 144-148, 150: NVLink5 errors whose action depends on a subcode in the
	// kernel log that NVML's event does not carry; most subcodes are IGNORE,
	// the fatal ones RESET_GPU [catalog, "WORKFLOW_NVLINK5_ERR"]. The driver
	// publishes the required action through Xid 154 and the GPU recovery
	// action, which the watcher acts on, so these report and wait for it.
	144: {Mnemonic: "NVLINK_SAW_ERROR", Description: "NVLINK: SAW Error (action by subcode; see Xid 154)", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	145: {Mnemonic: "NVLINK_RLW_ERROR", Description: "NVLINK: RLW Error (action by subcode; see Xid 154)", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	146: {Mnemonic: "NVLINK_TLW_ERROR", Description: "NVLINK: TLW Error (action by subcode; see Xid 154)", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	147: {Mnemonic: "NVLINK_TREX_ERROR", Description: "NVLINK: TREX Error", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	148: {Mnemonic: "NVLINK_NVLPW_CTRL_ERROR", Description: "NVLINK: NVLPW_CTRL Error", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	// 149: every subcode in the catalog is "Link Fatal", RESET_GPU.
	149: {Mnemonic: "NVLINK_NETIR_ERROR", Description: "NVLINK: NETIR Error (link fatal)", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionResetGPU},
	150: {Mnemonic: "NVLINK_MSE_ERROR", Description: "NVLINK: MSE Error (action by subcode; see Xid 154)", NVIDIA: "WORKFLOW_NVLINK5_ERR", Action: ActionIgnore},
	// 151: RESTART_VM, a reboot of the machine.
	151: {Mnemonic: "ROBUST_CHANNEL_KEY_ROTATION_ERROR", Description: "Key rotation Error", NVIDIA: "RESTART_VM", Action: ActionDrainNode},
	// 154: "summarizes the recovery action required for other Xids"
	// [catalog]. The watcher reads the recovery action
	// (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) when it sees this XID and acts
	// on that; this entry's action applies only when the field is unreadable,
	// and then the accompanying XIDs decide.
	154: {Mnemonic: "GPU_RECOVERY_ACTION_CHANGED", Description: "GPU Recovery Action Changed", NVIDIA: "XID_154", Action: ActionIgnore},
	155: {Mnemonic: "NVLINK_SW_DEFINED_ERROR", Description: "NVLINK: SW Defined Error (link down)", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	156: {Mnemonic: "RESOURCE_RETIREMENT_EVENT", Description: "Resource Retirement Event", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	157: {Mnemonic: "RESOURCE_RETIREMENT_FAILURE", Description: "Resource Retirement Failure", NVIDIA: "IGNORE", Action: ActionIgnore},
	158: {Mnemonic: "GPU_FATAL_TIMEOUT", Description: "GPU Fatal Timeout", NVIDIA: "RESET_GPU", Action: ActionResetGPU},
	// 159: CHECK_UVM: look at the unified-memory driver; the process using
	// it is the one to restart.
	159: {Mnemonic: "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", Description: "CHI Non-Data Error", NVIDIA: "CHECK_UVM", Action: ActionRestartWorkers},
	160: {Mnemonic: "CHANNEL_RETIREMENT_EVENT", Description: "Channel Retirement Event", NVIDIA: "IGNORE", Action: ActionIgnore},
	161: {Mnemonic: "CHANNEL_RETIREMENT_FAILURE", Description: "Channel Retirement Failure", NVIDIA: "IGNORE", Action: ActionIgnore},
}

package health

import "time"

// Device names a GPU for the Watcher: its NVML index and UUID.
type Device struct {
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
}

// Kind says where a finding comes from.
type Kind string

// The kinds of finding.
const (
	KindXID         Kind = "xid"             // an XID critical-error event
	KindECC         Kind = "ecc"             // ECC, poison and DRAM-retirement events
	KindRecovery    Kind = "recovery-action" // the driver's GPU recovery action
	KindUnavailable Kind = "gpu-unavailable" // GPU-unavailable event, or NVML_ERROR_GPU_IS_LOST
	KindMemory      Kind = "memory"          // retired pages, row remapping (polled)
	KindClocks      Kind = "clocks"          // slowdown clock-event reasons (polled)
	KindTemperature Kind = "temperature"     // GPU temperature (polled)
	KindNVLink      Kind = "nvlink"          // NVLink error counters and link state (polled)
	KindPCIe        Kind = "pcie"            // PCIe replay counter (polled)
)

// Finding is one health observation about one GPU. Identical findings
// (same GPU, kind, XID, message and action) that arrive before the consumer
// drains them are coalesced into one: Time is the first occurrence, Last the
// latest, Count how many there were.
type Finding struct {
	Time    time.Time `json:"time"`
	Last    time.Time `json:"last"`
	Count   int       `json:"count"`
	GPU     int       `json:"gpu"` // NVML index; -1 when NVML named a device the watcher does not know
	UUID    string    `json:"uuid"`
	Ranks   []int     `json:"ranks,omitempty"` // global ranks on the GPU when the finding was made
	Kind    Kind      `json:"kind"`
	XID     uint64    `json:"xid,omitempty"` // for KindXID
	Message string    `json:"message"`
	Action  Action    `json:"action"`
}

// Decide returns the most severe action of findings (drain > reset >
// restart > ignore); ActionIgnore when there are none.
func Decide(findings []Finding) Action {
	a := ActionIgnore
	for _, f := range findings {
		a = max(a, f.Action)
	}
	return a
}

// Stats counts what a Watcher has seen since it was made.
type Stats struct {
	Events    uint64 `json:"events"`    // NVML events received
	Findings  uint64 `json:"findings"`  // occurrences recorded, coalesced ones included
	Coalesced uint64 `json:"coalesced"` // occurrences merged into a finding not yet drained
}

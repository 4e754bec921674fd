// Package health watches the node's NVIDIA GPUs for faults, in the spirit
// of DCGM's health watches: NVML events (XIDs, ECC and poison errors, GPU
// unavailable, the driver's recovery action) and polled counters (page
// retirement and row remapping, slowdown clocks, temperature, NVLink and
// PCIe errors). Each observation becomes a Finding with the Action it
// calls for; the XID catalog (XIDClassify) says which action each XID
// calls for and why.
//
// A Watcher runs over an initialized NVML library (nvml.Open) and queues
// its findings for one consumer, never blocking on it. Like the rest of
// nvml/, it is the only kind of code that calls go-nvml; what it hands out
// are its own plain, JSON-serializable types.
package health

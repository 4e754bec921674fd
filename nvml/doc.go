// Package nvml is everything the agent knows about the node's NVIDIA GPUs:
// discovery and topology (which GPUs, how they are linked, which CPUs and
// NUMA node each is close to) and their state right now, over
// github.com/NVIDIA/go-nvml; GPU health (XIDs, ECC, polled counters) is
// in the subpackage health. It and its subpackages are the only code that
// calls go-nvml (the agent only hands the library over, and nvmltest holds
// the mocks);
// what it hands out are its own plain, JSON-serializable types.
//
// Every entry point takes the NVML library as a *Lib, our own handle, so
// that the agent holds and passes it without naming go-nvml: Open loads
// the real libnvidia-ml.so.1, and tests drive the same code with go-nvml's
// mocks (pkg/nvml/mock, mock/dgxa100) through nvmltest.Lib.
package nvml

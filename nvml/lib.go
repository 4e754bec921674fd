package nvml

import "github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"

// Lib is an initialized NVML library, from Open (or, in tests,
// nvmltest.Lib over go-nvml's mocks). Discover, ReadGPUState and
// health.NewWatcher take one; it keeps go-nvml's types inside nvml/, so
// the agent can hold and pass the library without naming them. Its
// Shutdown method shuts NVML down; the one who opened it calls that once,
// after everything using it has returned. A Lib is safe for concurrent
// use as far as NVML is.
type Lib = nvmlapi.Lib

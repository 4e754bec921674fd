package nvmlapi

import (
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Lib is an initialized NVML library. Package nvml exports it as nvml.Lib
// so that code outside nvml/ can hold and pass one without naming go-nvml;
// only nvml's own packages reach the go-nvml interface inside (Unwrap).
type Lib struct {
	nvml gonvml.Interface
}

// New wraps lib, which the caller has initialized (lib.Init): the real
// library (nvml.Open) or one of go-nvml's mocks (nvmltest.Lib).
func New(lib gonvml.Interface) *Lib { return &Lib{nvml: lib} }

// Unwrap returns the go-nvml interface inside l; nil for a nil l.
func Unwrap(l *Lib) gonvml.Interface {
	if l == nil {
		return nil
	}
	return l.nvml
}

// Shutdown shuts NVML down (nvmlShutdown). Call it once, after everything
// that uses the library has returned.
func (l *Lib) Shutdown() error {
	if ret := l.nvml.Shutdown(); ret != gonvml.SUCCESS {
		return fmt.Errorf("shut NVML down: %w", ret)
	}
	return nil
}

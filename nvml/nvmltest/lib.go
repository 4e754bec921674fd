package nvmltest

import (
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// Lib is lib, one of go-nvml's mocks (DGXA100, PCIeBox.Lib, a
// mock.Interface), as the *nvml.Lib that nvml.Discover, nvml.ReadGPUState
// and health.NewWatcher take, so that tests outside nvml/ need not import
// go-nvml. (nvmlapi.Lib is nvml.Lib; nvmltest cannot import nvml, whose
// own tests import nvmltest.) A nil lib gives a Lib with no library.
func Lib(lib gonvml.Interface) *nvmlapi.Lib { return nvmlapi.New(lib) }

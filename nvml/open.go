package nvml

import (
	"errors"
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/dl"
	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

// libraryName is the NVML library that go-nvml's loader opens.
const libraryName = "libnvidia-ml.so.1"

// ErrNoDriver is what errors from Open and Load match (errors.Is) when
// the node has no usable NVIDIA driver: libnvidia-ml.so.1 is missing, the
// kernel module is not loaded, or NVML cannot start. Such a node is a
// CPU-only node, not a broken one.
var ErrNoDriver = errors.New("no NVIDIA driver")

// NoDriverError says why NVML could not be started. It matches
// ErrNoDriver.
type NoDriverError struct {
	// Reason is one line for people: "libnvidia-ml.so.1 not found",
	// "NVIDIA kernel driver not loaded", ...
	Reason string
	// Return is NVML's answer to nvmlInit (an nvmlReturn_t value), 0 when
	// NVML did not answer at all.
	Return int
}

func (e *NoDriverError) Error() string { return "no NVIDIA driver: " + e.Reason }

// Is makes errors.Is(err, ErrNoDriver) true.
func (e *NoDriverError) Is(target error) bool { return target == ErrNoDriver }

// Open loads libnvidia-ml.so.1 with go-nvml's loader and initializes NVML.
// The caller owns the library and calls its Shutdown when done. Without a
// driver it returns a *NoDriverError (errors.Is(err, ErrNoDriver)); it
// never panics.
//
// go-nvml resolves NVML's symbols lazily, and calling any NVML function
// before a successful Init jumps through a null symbol and kills the
// process (a signal, not a Go panic), so Open calls nothing but Init until
// Init has succeeded.
func Open() (*Lib, error) {
	lib, err := initLibrary(gonvml.New(), probeLibrary)
	if err != nil {
		return nil, err
	}
	return nvmlapi.New(lib), nil
}

// probeLibrary returns dlopen's own message for why libnvidia-ml.so.1
// cannot be loaded ("libnvidia-ml.so.1: cannot open shared object file: No
// such file or directory"); go-nvml's Init reduces it to
// ERROR_LIBRARY_NOT_FOUND.
func probeLibrary() error {
	lib := dl.New(libraryName, dl.RTLD_LAZY|dl.RTLD_GLOBAL)
	if err := lib.Open(); err != nil {
		return err
	}
	return lib.Close()
}

// initLibrary runs lib.Init and turns its failures into errors; probe
// explains a missing library.
func initLibrary(lib gonvml.Interface, probe func() error) (_ gonvml.Interface, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = &NoDriverError{Reason: fmt.Sprintf("NVML panicked while loading: %v", r)}
		}
	}()
	ret := lib.Init()
	if ret == gonvml.SUCCESS {
		return lib, nil
	}
	e := &NoDriverError{Return: int(ret)}
	switch ret {
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		e.Reason = libraryName + " not found"
		// dlopen's message says more when the library is there but
		// cannot be loaded (wrong ELF class, a missing dependency).
		if perr := probe(); perr != nil && !strings.Contains(perr.Error(), "No such file or directory") {
			e.Reason = libraryName + " cannot be loaded: " + perr.Error()
		}
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		e.Reason = "NVIDIA kernel driver not loaded"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		e.Reason = libraryName + " does not match the loaded kernel driver (reload the driver or reboot)"
	case gonvml.ERROR_NO_PERMISSION:
		e.Reason = "no permission to open the NVIDIA device files"
	default:
		e.Reason = "NVML init: " + ret.Error()
	}
	return nil, e
}

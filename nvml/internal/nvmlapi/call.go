package nvmlapi

import gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

// Call calls an NVML binding and turns a panic (an incomplete mock, a
// binding missing from this driver) into ERROR_FUNCTION_NOT_FOUND.
func Call[T any](f func() (T, gonvml.Return)) (v T, ret gonvml.Return) {
	defer func() {
		if recover() != nil {
			ret = gonvml.ERROR_FUNCTION_NOT_FOUND
		}
	}()
	return f()
}

// CallRet is Call for bindings that return only a Return.
func CallRet(f func() gonvml.Return) (ret gonvml.Return) {
	defer func() {
		if recover() != nil {
			ret = gonvml.ERROR_FUNCTION_NOT_FOUND
		}
	}()
	return f()
}

// HasSymbol reports whether lib, the loaded NVML, has the function name.
// go-nvml loads libnvidia-ml lazily, and calling a function the driver
// lacks kills the process (a signal, not a Go panic), so callers ask before
// calling the newer ones. Without an answer (a mock without extensions,
// or one whose Extensions panics) it assumes yes.
func HasSymbol(lib gonvml.Interface, name string) (ok bool) {
	defer func() {
		if recover() != nil {
			ok = true
		}
	}()
	ext := lib.Extensions()
	if ext == nil {
		return true
	}
	return ext.LookupSymbol(name) == nil
}

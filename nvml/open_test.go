package nvml

import (
	"errors"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/ddp-agent/ddp-agent/nvml/internal/nvmlapi"
)

func TestInitLibrary(t *testing.T) {
	notFound := errors.New("libnvidia-ml.so.1: cannot open shared object file: No such file or directory")
	wrongELF := errors.New("libnvidia-ml.so.1: wrong ELF class: ELFCLASS32")
	ret := func(r gonvml.Return) func() gonvml.Return { return func() gonvml.Return { return r } }
	for _, tc := range []struct {
		name  string
		init  func() gonvml.Return
		dlerr error  // what dlopen says
		want  string // "" for success
	}{
		{"ok", ret(gonvml.SUCCESS), nil, ""},
		{"no library", ret(gonvml.ERROR_LIBRARY_NOT_FOUND), notFound, "no NVIDIA driver: libnvidia-ml.so.1 not found"},
		{"broken library", ret(gonvml.ERROR_LIBRARY_NOT_FOUND), wrongELF,
			"no NVIDIA driver: libnvidia-ml.so.1 cannot be loaded: libnvidia-ml.so.1: wrong ELF class: ELFCLASS32"},
		{"no kernel module", ret(gonvml.ERROR_DRIVER_NOT_LOADED), nil, "no NVIDIA driver: NVIDIA kernel driver not loaded"},
		{"version mismatch", ret(gonvml.ERROR_LIB_RM_VERSION_MISMATCH), nil, "does not match the loaded kernel driver"},
		{"no permission", ret(gonvml.ERROR_NO_PERMISSION), nil, "no permission"},
		{"other", ret(gonvml.ERROR_UNKNOWN), nil, "no NVIDIA driver: NVML init: " + gonvml.ERROR_UNKNOWN.Error()},
		{"panic", func() gonvml.Return { panic("dlopen exploded") }, nil, "no NVIDIA driver: NVML panicked while loading: dlopen exploded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lib := &mock.Interface{InitFunc: tc.init}
			got, err := initLibrary(lib, func() error { return tc.dlerr })
			if tc.want == "" {
				if err != nil || got != lib {
					t.Fatalf("got %v, %v; want the library", got, err)
				}
				return
			}
			if got != nil || !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, %v; want an ErrNoDriver containing %q", got, err, tc.want)
			}
			var nd *NoDriverError
			if !errors.As(err, &nd) || nd.Reason == "" {
				t.Errorf("got %#v, want a *NoDriverError with a reason", err)
			}
		})
	}
}

// TestOpenReal loads the real library: on a machine without the NVIDIA
// driver, Open says so and does not crash.
func TestOpenReal(t *testing.T) {
	lib, err := Open()
	if err == nil {
		defer lib.Shutdown()
		n, ret := nvmlapi.Unwrap(lib).DeviceGetCount()
		t.Logf("NVML is here: %d GPUs (%v)", n, ret)
		return
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("got %v, want ErrNoDriver", err)
	}
	t.Logf("Open: %v", err)
	if _, err := Load(t.Context()); !errors.Is(err, ErrNoDriver) {
		t.Errorf("Load: got %v, want ErrNoDriver", err)
	}
}

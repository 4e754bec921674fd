package nvml

import (
	"bytes"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

func TestWriteGPUs(t *testing.T) {
	box := newPCIeBox()
	box.Devs[1].GetMigModeFunc = func() (int, int, gonvml.Return) { return 0, 1, gonvml.SUCCESS }
	get := box.Lib.DeviceGetHandleByIndexFunc
	box.Lib.DeviceGetHandleByIndexFunc = func(i int) (gonvml.Device, gonvml.Return) {
		if i == 3 {
			return nil, gonvml.ERROR_GPU_IS_LOST
		}
		return get(i)
	}
	topo, err := Discover(t.Context(), nvmltest.Lib(box.Lib), box.options()...)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := WriteGPUs(&b, topo); err != nil {
		t.Fatal(err)
	}
	want := "Driver Version: 535.183.01   CUDA Version: 12.2   NVSwitch: no\n" +
		"GPU 0: NVIDIA A40 (UUID: GPU-0a000000-0000-0000-0000-000000000000)  bus 00000000:1B:00.0  49152 MiB  compute 8.6  MIG unsupported  NVLinks 0\n" +
		"GPU 1: NVIDIA A40 (UUID: GPU-0a000000-0000-0000-0000-000000000001)  bus 00000000:1C:00.0  49152 MiB  compute 8.6  MIG disabled (enabled after reset)  NVLinks 0\n" +
		"GPU 2: NVIDIA A40 (UUID: GPU-0a000000-0000-0000-0000-000000000002)  bus 00000000:88:00.0  49152 MiB  compute 8.6  MIG unsupported  NVLinks 0\n" +
		"GPU 3: no handle: " + gonvml.ERROR_GPU_IS_LOST.Error() + "\n"
	if b.String() != want {
		t.Errorf("got\n%s\nwant\n%s", b.String(), want)
	}
}

package nvml

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

func TestTopologyJSON(t *testing.T) {
	topo, err := Discover(t.Context(), nvmltest.Lib(dgxServer(true)), dgxOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(topo)
	if err != nil {
		t.Fatal(err)
	}
	var back Topology
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(&back, topo) {
		t.Errorf("round trip:\ngot  %+v\nwant %+v", back, *topo)
	}
	// The field names are an interface: check them.
	var raw map[string]any
	if err := json.Unmarshal(b, &raw); err != nil {
		t.Fatal(err)
	}
	gpu := raw["gpus"].([]any)[0].(map[string]any)
	link := raw["links"].([]any)[0].([]any)[1].(map[string]any)
	host := raw["host"].(map[string]any)
	for _, tc := range []struct {
		name string
		obj  map[string]any
		keys string
	}{
		{"topology", raw, "driver_version cuda_driver_version gpus links nvswitch host"},
		{"gpu", gpu, "index uuid name memory_total_bytes pci_bus_id numa_node gpu_numa_id cpu_affinity compute_capability mig_mode nvlinks nvswitch_links"},
		{"link", link, "class nvlinks nvlink_version via_nvswitch pcie p2p_read p2p_nvlink"},
		{"host", host, "cpu_model sockets cores cpus online_cpus numa_nodes"},
	} {
		for _, k := range strings.Fields(tc.keys) {
			if _, ok := tc.obj[k]; !ok {
				t.Errorf("%s: no %q in %v", tc.name, k, tc.obj)
			}
		}
	}
	if got := fmt.Sprint(gpu["cpu_affinity"], " ", link["class"], " ", link["pcie"]); got != "48-63,176-191 NV12 PXB" {
		t.Errorf("values: got %s, want 48-63,176-191 NV12 PXB", got)
	}
}

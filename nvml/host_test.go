package nvml

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
	"testing/fstest"
)

func TestDiscoverHost(t *testing.T) {
	box := newPCIeBox()
	h, err := DiscoverHost(t.Context(), box.options()...)
	if err != nil {
		t.Fatal(err)
	}
	h.Hostname = ""
	want := HostInfo{
		CPUModel: "Intel(R) Xeon(R) Gold 6326 CPU @ 2.90GHz", Sockets: 2, Cores: 32, CPUs: 64,
		OnlineCPUs: seq(0, 63),
		NUMANodes: []NUMANode{
			{ID: 0, CPUs: mustList("0-15,32-47"), MemoryTotal: 131072000 * 1024},
			{ID: 1, CPUs: mustList("16-31,48-63"), MemoryTotal: 131072000 * 1024},
		},
	}
	if !reflect.DeepEqual(h, want) {
		t.Errorf("got  %+v\nwant %+v", h, want)
	}
	var b bytes.Buffer
	if err := WriteHost(&b, h); err != nil {
		t.Fatal(err)
	}
	const text = `CPU(s):              64
On-line CPU(s) list: 0-63
Model name:          Intel(R) Xeon(R) Gold 6326 CPU @ 2.90GHz
Socket(s):           2
Core(s) per socket:  16
Thread(s) per core:  2
NUMA node(s):        2
NUMA node0 CPU(s):   0-15,32-47  (125 GiB memory)
NUMA node1 CPU(s):   16-31,48-63  (125 GiB memory)
`
	if b.String() != text {
		t.Errorf("WriteHost:\ngot\n%s\nwant\n%s", b.String(), text)
	}
}

// TestDiscoverHostPartial: a kernel without NUMA nodes is not an error; an
// unreadable online list and a failing gopsutil are, and what was read is
// still returned.
func TestDiscoverHostPartial(t *testing.T) {
	fsys := fstest.MapFS{"devices/system/cpu/possible": {Data: []byte("0-3\n")}}
	h, err := DiscoverHost(t.Context(), WithSysFS(fsys), withCPUFacts(cpuFacts{cpus: 4}, errors.New("cpu info: no /proc")))
	if err == nil || !strings.Contains(err.Error(), "no /proc") || !strings.Contains(err.Error(), "online CPUs") {
		t.Errorf("err: got %v, want gopsutil's and the online list's", err)
	}
	if h.CPUs != 4 || len(h.NUMANodes) != 0 || h.NUMANodes == nil || h.OnlineCPUs == nil {
		t.Errorf("got %+v, want 4 CPUs, no NUMA nodes (as empty lists)", h)
	}
	var b bytes.Buffer
	WriteHost(&b, h)
	if !strings.Contains(b.String(), "NUMA node(s):        none reported by the kernel\n") {
		t.Errorf("WriteHost:\n%s", b.String())
	}
}

// TestDiscoverHostReal reads this machine: whatever it has, the layout is
// consistent.
func TestDiscoverHostReal(t *testing.T) {
	h, err := DiscoverHost(t.Context())
	if err != nil {
		t.Logf("partial: %v", err)
	}
	if h.CPUs <= 0 || len(h.OnlineCPUs) == 0 {
		t.Errorf("got %+v, want CPUs", h)
	}
	for _, n := range h.NUMANodes {
		for _, c := range n.CPUs {
			if !containsInt(h.OnlineCPUs, c) && len(h.OnlineCPUs) > 0 {
				t.Errorf("node %d CPU %d not online (%v)", n.ID, c, h.OnlineCPUs)
			}
		}
	}
}

func containsInt(l CPUList, c int) bool {
	for _, x := range l {
		if x == c {
			return true
		}
	}
	return false
}

package sidecar

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
	"github.com/ddp-agent/ddp-agent/wire"
)

// TestGPUFaults: on go-nvml's mock of a DGX A100, an XID that calls for a
// restart aborts the job whose worker uses that GPU, and not the job on
// another GPU; one that calls for a drain (79: fallen off the bus) aborts
// every job on the node.
func TestGPUFaults(t *testing.T) {
	server := nvmltest.DGXA100(true)
	nvmltest.QuietPolls(server)
	events := nvmltest.NewEvents(server)
	topo, err := nvml.Discover(t.Context(), nvmltest.Lib(server), nvml.WithSysFS(nvmltest.DGXSysFS()))
	if err != nil {
		t.Fatal(err)
	}
	sc, lb := startSidecar(t, Config{GPUs: &GPUs{Topology: topo,
		Watch: func(devs []health.Device, opts ...health.Option) *health.Watcher {
			return health.NewWatcher(nvmltest.Lib(server), devs, append(opts, health.WithInterval(50*time.Millisecond))...)
		}}})
	a, _, err := dial(t, sc, hello("a", 0, 0, 0, 1, 1, wire.HelloGPU, topo.GPUs[1].UUID))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := dial(t, sc, hello("b", 0, 0, 0, 1, 1, wire.HelloGPU, topo.GPUs[2].UUID))
	if err != nil {
		t.Fatal(err)
	}
	inject := func(gpu int, xid uint64) {
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		defer cancel()
		if err := events.Inject(ctx, gpu, nvmltest.EventXID, xid); err != nil {
			t.Fatalf("inject XID %d: %v", xid, err)
		}
	}
	inject(1, 31)
	select {
	case <-a.Aborted():
		if !a.Told() {
			t.Errorf("job a: connection lost, not aborted: %s", a.AbortReason())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("job a (on GPU 1) not aborted after XID 31\n%s", lb.String())
	}
	select {
	case <-b.Aborted():
		t.Fatalf("job b (on GPU 2) aborted by GPU 1's XID 31: %s", b.AbortReason())
	case <-time.After(300 * time.Millisecond):
	}
	inject(0, 79)
	select {
	case <-b.Aborted():
	case <-time.After(10 * time.Second):
		t.Fatalf("job b not aborted after XID 79 (drain)\n%s", lb.String())
	}
	waitFor(t, func() bool { return strings.Contains(lb.String(), "this node must be drained or its GPU reset") })
}

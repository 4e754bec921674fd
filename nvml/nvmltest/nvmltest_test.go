package nvmltest_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/ddp-agent/ddp-agent/nvml"
	"github.com/ddp-agent/ddp-agent/nvml/health"
	"github.com/ddp-agent/ddp-agent/nvml/nvmltest"
)

func TestDGXA100Discover(t *testing.T) {
	for _, remoteType := range []bool{true, false} {
		s := nvmltest.DGXA100(remoteType)
		topo, err := nvml.Discover(t.Context(), nvmltest.Lib(s), nvml.WithSysFS(nvmltest.DGXSysFS()))
		if err != nil {
			t.Fatal(err)
		}
		if len(topo.GPUs) != 8 || !topo.NVSwitch {
			t.Fatalf("remote type %v: %d GPUs, NVSwitch %v; want 8 over NVSwitch", remoteType, len(topo.GPUs), topo.NVSwitch)
		}
		numa := nvmltest.DGXNUMA()
		for i, g := range topo.GPUs {
			want, _ := nvml.ParseCPUList(nvmltest.DGXNodeCPUs(numa[i]))
			if g.NUMANode != numa[i] || !slices.Equal(g.CPUAffinity, want) || g.NVSwitchLinks != 12 {
				t.Errorf("GPU%d: NUMA %d CPUs %v NVSwitch links %d; want %d, %v, 12", i, g.NUMANode, g.CPUAffinity, g.NVSwitchLinks, numa[i], want)
			}
			for j, l := range topo.Links[i] {
				if j != i && (l.NVLinks != 12 || !l.ViaNVSwitch || l.Class() != "NV12") {
					t.Errorf("GPU%d-GPU%d: %+v (%s), want NV12 over NVSwitch", i, j, l, l.Class())
				}
			}
		}
	}
}

func TestPCIeBoxDiscover(t *testing.T) {
	box := nvmltest.NewPCIeBox()
	topo, err := nvml.Discover(t.Context(), nvmltest.Lib(box.Lib), nvml.WithSysFS(box.SysFS()))
	if err != nil {
		t.Fatal(err)
	}
	if len(topo.GPUs) != 4 || topo.NVSwitch {
		t.Fatalf("%d GPUs, NVSwitch %v; want 4 without", len(topo.GPUs), topo.NVSwitch)
	}
	for i, g := range topo.GPUs {
		if want := []int{0, 0, 1, 1}[i]; g.NUMANode != want || g.UUID != box.GPUs[i].UUID {
			t.Errorf("GPU%d: NUMA %d UUID %s, want %d and %s", i, g.NUMANode, g.UUID, want, box.GPUs[i].UUID)
		}
		for j, l := range topo.Links[i] {
			want := nvml.PathSYS
			switch {
			case i == j:
				want = nvml.PathSelf
			case i/2 == j/2 && i < 2:
				want = nvml.PathPIX
			case i/2 == j/2:
				want = nvml.PathPHB
			}
			if l.PCIe != want || l.NVLinks != 0 {
				t.Errorf("GPU%d-GPU%d: %+v, want %s and no NVLink", i, j, l, want)
			}
		}
	}
	// The CPU model and counts are this machine's (gopsutil); /sys is the box's.
	if len(topo.Host.NUMANodes) != 2 || len(topo.Host.OnlineCPUs) != 64 {
		t.Errorf("host %+v, want 2 NUMA nodes and 64 CPUs online", topo.Host)
	}
}

// TestEventsInject: a watcher on the quiet DGX A100 finds nothing until a
// test injects an XID, then finds that on the GPU it names.
func TestEventsInject(t *testing.T) {
	s := nvmltest.DGXA100(true)
	nvmltest.QuietPolls(s)
	ev := nvmltest.NewEvents(s)

	// QuietPolls leaves DGXA100's NVLinks up: discovery still sees them.
	topo, err := nvml.Discover(t.Context(), nvmltest.Lib(s), nvml.WithSysFS(nvmltest.DGXSysFS()))
	if err != nil || topo.GPUs[0].NVLinks != 12 {
		t.Fatalf("discover after QuietPolls: %v, %+v", err, topo)
	}

	w := health.NewWatcher(nvmltest.Lib(s), nil,
		health.WithInterval(20*time.Millisecond),
		health.WithLogger(slog.New(slog.DiscardHandler)))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()

	time.Sleep(150 * time.Millisecond) // several polls
	if fs := w.Drain(); len(fs) != 0 {
		t.Errorf("quiet machine: findings %+v", fs)
	}

	ictx, icancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer icancel()
	if err := ev.Inject(ictx, 2, gonvml.EventTypeXidCriticalError, 79); err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer ncancel()
	var got []health.Finding
	for !slices.ContainsFunc(got, func(f health.Finding) bool { return f.XID == 79 }) {
		fs, err := w.Next(nctx)
		if err != nil {
			t.Fatalf("no XID 79 finding; saw %+v", got)
		}
		got = append(got, fs...)
	}
	f := got[slices.IndexFunc(got, func(f health.Finding) bool { return f.XID == 79 })]
	if uuid := s.Devices[2].(*dgxa100.Device).UUID; f.GPU != 2 || f.UUID != uuid || f.Kind != health.KindXID || f.Action != health.ActionDrainNode {
		t.Errorf("finding %+v, want XID on GPU 2 (%s), drain-node", f, uuid)
	}

	// An event on a GPU the library does not list.
	if err := ev.Inject(ictx, -1, gonvml.EventTypeXidCriticalError, 13); err != nil {
		t.Fatal(err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5s of cancel")
	}
	if n := ev.Frees(); n != 1 {
		t.Errorf("event set freed %d times, want 1", n)
	}

	// Nobody waits now: Inject gives up with ctx's error.
	tctx, tcancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
	defer tcancel()
	if err := ev.Inject(tctx, 0, gonvml.EventTypeXidCriticalError, 13); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Inject with nobody waiting: %v, want the deadline", err)
	}
	if err := ev.Inject(tctx, 8, gonvml.EventTypeXidCriticalError, 13); err == nil {
		t.Error("Inject on GPU 8 of 8: no error")
	}
}

func TestMask(t *testing.T) {
	for _, s := range []string{"0", "0-15,32-47", "63-64", "1,127-129,255"} {
		l, err := nvml.ParseCPUList(s)
		if err != nil {
			t.Fatal(err)
		}
		m := nvmltest.Mask(l)
		var back []int
		for w, word := range m {
			for b := range 64 {
				if word&(1<<b) != 0 {
					back = append(back, 64*w+b)
				}
			}
		}
		if !slices.Equal(back, []int(l)) {
			t.Errorf("Mask(%s) = %#x, reads back as %v", s, m, back)
		}
	}
}

package shm

import (
	"errors"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
)

// TestGate: a rank writes into a peer's buffer only through an open gate,
// and a rank that closes its gate waits for a write under way, unless the
// writer's process is gone.
func TestGate(t *testing.T) {
	comms := newGroup(t, 2, Config{Timeout: time.Minute, DirectMin: 1})
	negotiate(t, comms)
	buf := []byte("untouched")
	p0 := peer{rank: 0, pid: os.Getpid(), addr: addrOf(buf)}

	// Rank 0 is not in collective step 5: the write is refused, the buffer
	// untouched.
	err := comms[1].writePeer(p0, 5, func() error { return vmWrite(p0.pid, []byte("clobbered"), p0.addr) })
	var pe *failure.PeerError
	if !errors.As(err, &pe) || pe.Rank != 0 {
		t.Fatalf("write through a closed gate: %v, want a failure.PeerError naming rank 0", err)
	}
	if string(buf) != "untouched" {
		t.Fatalf("buffer is %q after a refused write", buf)
	}
	comms[0].openGate(5)
	if err := comms[1].writePeer(p0, 5, func() error { return vmWrite(p0.pid, []byte("written.."), p0.addr) }); err != nil || string(buf) != "written.." {
		t.Fatalf("write through an open gate: %v, buffer %q", err, buf)
	}

	// Rank 1 says it is writing into rank 0: closing waits for it.
	atomic.StoreUint32(comms[1].ctl[1].writing, 1)
	closed := make(chan error, 1)
	go func() { closed <- comms[0].closeGate(&job{base: 4}) }()
	select {
	case err := <-closed:
		t.Fatalf("closeGate returned (%v) while a peer was writing", err)
	case <-time.After(100 * time.Millisecond):
	}
	if err := comms[1].writePeer(p0, 5, func() error { return vmWrite(p0.pid, []byte("late....."), p0.addr) }); err == nil || string(buf) != "written.." {
		t.Fatalf("write after the gate closed: %v, buffer %q", err, buf)
	}
	atomic.StoreUint32(comms[1].ctl[1].writing, 1) // writePeer cleared it
	time.Sleep(20 * time.Millisecond)
	atomic.StoreUint32(comms[1].ctl[1].writing, 0)
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("closeGate still waits after the write ended")
	}

	// A writer whose process died mid-write (a zombie here: killed, not
	// yet reaped) writes no more: closing does not wait for it.
	dead := exec.Command("sleep", "60")
	if err := dead.Start(); err != nil {
		t.Skip("no sleep(1) to stand in for a dead writer:", err)
	}
	dead.Process.Kill()
	defer dead.Wait()
	time.Sleep(50 * time.Millisecond)
	atomic.StoreUint32(comms[1].ctl[1].pid, uint32(dead.Process.Pid))
	atomic.StoreUint32(comms[1].ctl[1].writing, 1)
	start := time.Now()
	if err := comms[0].closeGate(&job{base: 4}); err != nil || time.Since(start) > time.Second {
		t.Fatalf("closeGate with a dead writer: %v after %v", err, time.Since(start))
	}
}

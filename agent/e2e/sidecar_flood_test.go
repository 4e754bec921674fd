package e2e

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/agentconn"
	"github.com/ddp-agent/ddp-agent/wire"
)

// A sidecar admits by the Hello, so before it a connection is anyone's of
// the user's: these tests flood a real sidecar with connections that say
// nothing and with Hellos built to cost, and check what it holds and that
// a real worker still gets in.

// helloHelper is a worker that says a sidecar Hello and reports the
// Welcome.
func helloHelper() int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, w, err := agentconn.Dial(ctx, os.Getenv("DDP_AGENT_SOCKET"), wire.Hello{PID: int32(os.Getpid()), Transports: []string{"host"},
		Job: map[string]string{wire.HelloJob: "flooded", wire.HelloWorldSize: "1", wire.HelloLocalWorldSize: "1", wire.HelloGroupRank: "0"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "dial:", err)
		return 1
	}
	c.Close()
	fmt.Printf("welcome to job %s\n", w.JobID)
	return 0
}

// procStatus is a field of /proc/pid/status, in kB for the memory ones.
func procStatus(t *testing.T, pid int, field string) int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.Atoi(strings.Fields(v)[0])
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func openFDs(t *testing.T, pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// admitWorker runs helloHelper against sock and fails unless it is
// welcome within a second or two.
func admitWorker(t *testing.T, sock string, sc *bgProc) {
	t.Helper()
	self, _ := os.Executable()
	cmd := exec.Command(self)
	cmd.Env = append(os.Environ(), "E2E_HELPER=hello", "DDP_AGENT_SOCKET="+sock)
	begin := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "welcome to job flooded") {
		t.Fatalf("a real worker was not admitted: %v\n%s\n%s", err, out, sc.logs())
	}
	if took := time.Since(begin); took > 3*time.Second {
		t.Errorf("a real worker took %v to be admitted", took)
	}
}

// TestSidecarIdleFlood: 2,000 connections of one process that never say
// Hello. Before, the sidecar held every one (an fd and a goroutine each,
// until the 10 s handshake deadline), and ~20,700 exhausted its fds; now
// it holds MaxConnsPerProcess of them, refuses the rest at once, and a
// real worker is admitted meanwhile.
func TestSidecarIdleFlood(t *testing.T) {
	budget(t, 10*time.Second)
	sock := sidecarSocket(t, "flood")
	sc := startSidecar(t, sock)
	pid := sc.cmd.Process.Pid
	base := openFDs(t, pid)
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for range 2000 {
		c, err := net.Dial("unix", sock)
		if err != nil {
			t.Fatalf("dial %d: %v", len(conns), err)
		}
		conns = append(conns, c)
	}
	// The refusals are answered at once: wait for the sidecar to have
	// answered and closed the ones it refuses.
	var held int
	waitFor(t, 10*time.Second, func() bool {
		held = openFDs(t, pid) - base
		return held <= 2*control16
	}, func() string {
		return fmt.Sprintf("the sidecar holds %d more fds than before the flood\n%s", held, sc.logs())
	})
	t.Logf("the sidecar holds %d more fds with 2000 idle connections open against it", held)
	admitWorker(t, sock, sc)
}

// control16 is the control server's default MaxConnsPerProcess.
const control16 = 16

// TestSidecarCostlyHello: sixteen Hellos built to cost the reader, each
// just under the 16 MiB frame limit: 4 M empty transport names and a
// valid job. Before, each decoded to ~130 MB, was admitted and kept for
// its connection's life: 16 took the sidecar past 1.4 GB. Now a Hello
// over 64 KiB is refused by its size before it is read, one with more
// than 16 transports by their count, and a real worker is admitted after
// them.
func TestSidecarCostlyHello(t *testing.T) {
	budget(t, 10*time.Second)
	sock := sidecarSocket(t, "hello")
	sc := startSidecar(t, sock)
	pid := sc.cmd.Process.Pid
	rss0 := procStatus(t, pid, "VmRSS")
	job := map[string]string{wire.HelloJob: "costly", wire.HelloWorldSize: "1", wire.HelloLocalWorldSize: "1", wire.HelloGroupRank: "0"}
	for _, names := range []int{(wire.MaxPayload - 200) / 4, 2000} {
		frame, err := wire.AppendFrame(nil, 1, wire.Hello{PID: int32(os.Getpid()), Transports: make([]string, names), Job: job})
		if err != nil {
			t.Fatal(err)
		}
		var conns []net.Conn
		for i := range 16 {
			c, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			conns = append(conns, c)
			// The sidecar may refuse before it read all of it: a write
			// error is its answer too.
			c.SetDeadline(time.Now().Add(10 * time.Second))
			_, werr := c.Write(frame)
			reply, rerr := wire.ReadFrame(c, 0)
			if rerr != nil && werr == nil {
				t.Fatalf("hello %d of %d names: no answer: %v", i, names, rerr)
			}
			if rerr == nil && reply.Type != wire.TypeError {
				t.Errorf("hello %d of %d names (%d bytes): answered %v, want an Error", i, names, len(frame), reply.Type)
			}
		}
		rss := procStatus(t, pid, "VmRSS")
		t.Logf("sidecar RSS %d MiB before the Hellos, %d MiB with 16 connections of Hellos of %d names", rss0>>10, rss>>10, names)
		if grew := rss - rss0; grew > 64<<10 {
			t.Errorf("the sidecar's RSS grew by %d MiB", grew>>10)
		}
		for _, c := range conns {
			c.Close()
		}
	}
	admitWorker(t, sock, sc)
}

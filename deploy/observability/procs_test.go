package observability

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/syncbuf"
)

// proc is a process the test started in a process group of its own; the
// test's cleanup ends the group (SIGTERM, then SIGKILL after 10 s).
type proc struct {
	name string
	cmd  *exec.Cmd
	out  syncbuf.Buffer
	done chan struct{}
	err  error // Wait's, once done is closed
}

// start starts argv with env (the whole environment) in dir and registers
// its cleanup.
func start(t *testing.T, name, dir string, env []string, argv ...string) *proc {
	t.Helper()
	p := &proc{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Dir = dir
	p.cmd.Env = env
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.stop)
	return p
}

// stop ends p's process group: SIGTERM (the agent stops its workers), then
// SIGKILL for whatever is left after 10 s. Safe to call more than once.
func (p *proc) stop() {
	pgid := p.cmd.Process.Pid
	select {
	case <-p.done:
	default:
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
		}
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL) // ESRCH when the group is gone
	<-p.done
}

// exited reports whether p has exited.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// tail is the last n bytes of p's output, for failure messages.
func (p *proc) tail(n int) string {
	s := p.out.String()
	if len(s) > n {
		s = "..." + s[len(s)-n:]
	}
	return fmt.Sprintf("--- %s output ---\n%s", p.name, s)
}

// freePorts returns n distinct TCP ports free on 127.0.0.1 just now.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	var ls []net.Listener
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	for _, l := range ls {
		l.Close()
	}
	return ports
}

// httpGet GETs url with a 5 s timeout and returns the status and body.
func httpGet(ctx context.Context, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// waitReady polls url until it answers 200, p exits, or ctx ends.
func waitReady(ctx context.Context, t *testing.T, p *proc, url string) {
	t.Helper()
	for {
		if code, _, err := httpGet(ctx, url); err == nil && code == http.StatusOK {
			return
		}
		if p.exited() {
			t.Fatalf("%s exited before %s answered: %v\n%s", p.name, url, p.err, p.tail(4000))
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: %s not ready: %v\n%s", p.name, url, ctx.Err(), p.tail(4000))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// cleanEnv is the test's environment without the OTEL_* variables (the
// test sets its own), plus extra.
func cleanEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OTEL_") {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// leftovers lists the processes whose command line contains marker.
func leftovers(marker string) []string {
	var found []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte(marker)) {
			continue
		}
		found = append(found, e.Name()+": "+strings.ReplaceAll(string(b), "\x00", " "))
	}
	return found
}

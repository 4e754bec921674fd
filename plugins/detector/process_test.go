package detector_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	goplugin "github.com/hashicorp/go-plugin"

	"github.com/ddp-agent/ddp-agent/plugins"
	"github.com/ddp-agent/ddp-agent/plugins/detector"
	"github.com/ddp-agent/ddp-agent/plugins/notifier"
)

// buildPlugin builds testdata/plugin with the given protocol version.
func buildPlugin(t *testing.T, protocol int) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "echo-plugin")
	cmd := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin,
		"-ldflags", "-X main.protocol="+strconv.Itoa(protocol), "./testdata/plugin")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build the test plugin: %v\n%s", err, out)
	}
	return bin
}

// startPlugin starts bin as the agent does: gRPC only, AutoMTLS, the
// agent's client set, SIGKILL when the starting thread's process dies.
func startPlugin(t *testing.T, bin string) *goplugin.Client {
	t.Helper()
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	client := goplugin.NewClient(&goplugin.ClientConfig{
		HandshakeConfig: plugins.Handshake(),
		Plugins: goplugin.PluginSet{
			plugins.InfoName:             &plugins.InfoPlugin{},
			string(plugins.KindDetector): &detector.Plugin{},
			string(plugins.KindNotifier): &notifier.Plugin{},
		},
		Cmd:              cmd,
		AllowedProtocols: []goplugin.Protocol{goplugin.ProtocolGRPC},
		AutoMTLS:         true,
		Logger:           hclog.NewNullLogger(),
		StartTimeout:     20 * time.Second,
	})
	t.Cleanup(client.Kill)
	return client
}

func TestRealPluginProcess(t *testing.T) {
	client := startPlugin(t, buildPlugin(t, plugins.ProtocolVersion))
	rpc, err := client.Client()
	if err != nil {
		t.Fatal(err)
	}
	if client.NegotiatedVersion() != plugins.ProtocolVersion {
		t.Errorf("negotiated protocol %d", client.NegotiatedVersion())
	}
	raw, err := rpc.Dispense(plugins.InfoName)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	info, err := raw.(plugins.Described).Info(ctx)
	if err != nil || info.Name != "echo" || info.Kind != plugins.KindDetector {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	raw, err = rpc.Dispense(string(plugins.KindDetector))
	if err != nil {
		t.Fatal(err)
	}
	d := raw.(detector.Detector)
	if sched, err := d.Configure(ctx, plugins.Config{"message": "over the wire"}); err != nil || sched.Every != time.Second {
		t.Fatalf("Configure = %+v, %v", sched, err)
	}
	n := 0
	stop := errors.New("enough")
	err = d.Watch(ctx, func(f detector.Finding) error {
		if f.Message != "over the wire" || f.Time.IsZero() {
			t.Errorf("finding %+v", f)
		}
		if n++; n == 3 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Watch = %v, want emit's error after 3 findings", err)
	}
	client.Kill()
	if !client.Exited() {
		t.Error("the plugin process is still running after Kill")
	}
}

func TestOtherProtocolVersionRefused(t *testing.T) {
	client := startPlugin(t, buildPlugin(t, plugins.ProtocolVersion+1))
	_, err := client.Client()
	want := "Plugin version: " + strconv.Itoa(plugins.ProtocolVersion+1)
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("Client() = %v, want go-plugin's refusal naming %q", err, want)
	}
}

func TestRunByHandSaysWhatItIs(t *testing.T) {
	bin := buildPlugin(t, plugins.ProtocolVersion)
	cmd := exec.Command(bin)
	cmd.Env = os.Environ() // without the cookie
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("run by hand: %v, want exit code 1", err)
	}
	if lines := strings.Split(strings.TrimSpace(string(out)), "\n"); len(lines) != 1 || !strings.Contains(lines[0], "is a ddp-agent plugin") {
		t.Errorf("run by hand printed %q, want one line saying it is a ddp-agent plugin", out)
	}
}

// TestPluginDiesWithItsParent: a plugin whose parent is SIGKILLed (no
// Pdeathsig here) exits by itself once it sees it has a new parent.
func TestPluginDiesWithItsParent(t *testing.T) {
	bin := buildPlugin(t, plugins.ProtocolVersion)
	sh := exec.Command("/bin/sh", "-c", `"$0" >/dev/null 2>&1 & echo $!; wait`, bin)
	sh.Env = append(os.Environ(), plugins.MagicCookieKey+"="+plugins.MagicCookieValue)
	stdout, err := sh.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sh.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	time.Sleep(300 * time.Millisecond) // let it start serving and record its parent
	if !alive(pid) {
		t.Fatal("the plugin did not start")
	}
	_ = sh.Process.Kill()
	_ = sh.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin %d still runs 5 s after its parent died", pid)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// alive reports whether pid runs; a zombie (exited, not yet reaped by
// whoever adopted it) does not.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

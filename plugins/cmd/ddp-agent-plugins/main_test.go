package main

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"runtime"
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

func TestList(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--list"}, &out, &errb, false); code != 0 {
		t.Fatalf("--list exited %d: %s", code, errb.String())
	}
	if got := out.String(); got != "disk\nexec\nnic\nwebhook\n" {
		t.Errorf("--list printed %q", got)
	}
}

func TestRefusals(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"exec"}, 1, "ddp-agent-plugins: exec is a ddp-agent plugin, started by `ddp-agent run --plugin exec[,key=value...]`; it does nothing run by hand\n"},
		{[]string{"nope"}, 2, `no bundled plugin "nope"`},
		{nil, 2, "usage: ddp-agent-plugins NAME | --list"},
		{[]string{"exec", "nic"}, 2, "usage:"},
		{[]string{"--help"}, 2, "usage:"},
	} {
		var out, errb bytes.Buffer
		code := run(tc.args, &out, &errb, false)
		if code != tc.code || !strings.Contains(errb.String(), tc.want) || strings.Count(errb.String(), "\n") != 1 || out.Len() != 0 {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and one line with %q", tc.args, code, errb.String(), tc.code, tc.want)
		}
	}
}

// TestServedByTheBinary starts each bundled plugin as the agent does and
// checks it answers to its name (the agent refuses a binary serving
// another), then runs the exec plugin's check over the wire.
func TestServedByTheBinary(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "ddp-agent-plugins")
	build := exec.Command(filepath.Join(runtime.GOROOT(), "bin", "go"), "build", "-o", bin, ".")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	kinds := map[string]plugins.Kind{"exec": plugins.KindDetector, "nic": plugins.KindDetector, "disk": plugins.KindDetector, "webhook": plugins.KindNotifier}
	for _, name := range bundled().names() {
		t.Run(name, func(t *testing.T) {
			rpc := start(t, bin, name)
			raw, err := rpc.Dispense(plugins.InfoName)
			if err != nil {
				t.Fatal(err)
			}
			info, err := raw.(plugins.Described).Info(context.Background())
			if err != nil || info.Name != name || info.Kind != kinds[name] {
				t.Fatalf("Info = %+v, %v; want name %s, kind %s", info, err, name, kinds[name])
			}
		})
	}
	t.Run("exec check", func(t *testing.T) {
		raw, err := start(t, bin, "exec").Dispense(string(plugins.KindDetector))
		if err != nil {
			t.Fatal(err)
		}
		d := raw.(detector.Detector)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		if _, err := d.Configure(ctx, plugins.Config{"command": "echo scheduled maintenance; exit 3"}); err != nil {
			t.Fatal(err)
		}
		var got detector.Finding
		watchCtx, stop := context.WithCancel(ctx)
		_ = d.Watch(watchCtx, func(f detector.Finding) error { got = f; stop(); return nil })
		if got.Action != detector.ActionDrainNode || got.Message != "scheduled maintenance" {
			t.Errorf("finding %+v", got)
		}
	})
}

func start(t *testing.T, bin, name string) goplugin.ClientProtocol {
	t.Helper()
	cmd := exec.Command(bin, name)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
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
	rpc, err := client.Client()
	if err != nil {
		t.Fatal(err)
	}
	return rpc
}

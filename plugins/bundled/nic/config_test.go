package nic

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// fakeSysfs writes files (path relative to root: content) into a new
// directory, a sysfs as a test wants it.
func fakeSysfs(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for p, content := range files {
		path := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// aHost is a host with a device-backed NIC up, one down, a bridge up,
// lo, and an InfiniBand HCA with one port ACTIVE and one down.
func aHost(t *testing.T) string {
	root := fakeSysfs(t, map[string]string{
		"class/net/lo/operstate": "unknown", "class/net/lo/carrier": "1",
		"class/net/eno1/operstate": "up", "class/net/eno1/carrier": "1", "class/net/eno1/carrier_changes": "3", "class/net/eno1/speed": "25000",
		"class/net/eno2/operstate": "down", "class/net/eno2/carrier": "0", "class/net/eno2/carrier_changes": "1", "class/net/eno2/speed": "-1",
		"class/net/docker0/operstate": "up", "class/net/docker0/carrier": "1",
		"class/infiniband/mlx5_0/ports/1/state": "4: ACTIVE", "class/infiniband/mlx5_0/ports/1/phys_state": "5: LinkUp",
		"class/infiniband/mlx5_0/ports/1/rate": "200 Gb/sec (4X HDR)", "class/infiniband/mlx5_0/ports/1/counters/link_downed": "0",
		"class/infiniband/mlx5_0/ports/2/state": "1: DOWN", "class/infiniband/mlx5_0/ports/2/phys_state": "3: Disabled",
	})
	for _, nic := range []string{"eno1", "eno2"} {
		if err := os.MkdirAll(filepath.Join(root, "class/net", nic, "device"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestConfigure(t *testing.T) {
	sysfs := aHost(t)
	for _, tc := range []struct {
		name  string
		cfg   plugins.Config
		ports string
		every time.Duration
		err   string
	}{
		{"defaults", plugins.Config{}, "eno1 mlx5_0/1", 5*time.Second + readTimeout, ""},
		{"named", plugins.Config{"interfaces": "eno2, docker0", "interval": "1s"}, "eno2 docker0", time.Second + readTimeout, ""},
		{"IB device: all its ports", plugins.Config{"interfaces": "mlx5_0,eno1"}, "mlx5_0/1 mlx5_0/2 eno1", 5*time.Second + readTimeout, ""},
		{"IB port", plugins.Config{"interfaces": "mlx5_0/2", "min-rate": "100000"}, "mlx5_0/2", 5*time.Second + readTimeout, ""},
		{"missing interface", plugins.Config{"interfaces": "eno1,ib7"}, "", 0, `option interfaces: no interface "ib7"`},
		{"missing IB port", plugins.Config{"interfaces": "mlx5_0/3"}, "", 0, "option interfaces: no InfiniBand port mlx5_0/3"},
		{"escape", plugins.Config{"interfaces": "../../etc"}, "", 0, "option interfaces:"},
		{"bad interval", plugins.Config{"interval": "often"}, "", 0, `option interval: "often" is not a duration`},
		{"bad min-rate", plugins.Config{"min-rate": "10G"}, "", 0, `option min-rate: "10G" is not a whole number`},
		{"negative min-rate", plugins.Config{"min-rate": "-1"}, "", 0, "option min-rate"},
		{"unknown option", plugins.Config{"iface": "eno1"}, "", 0, `unknown option "iface"`},
	} {
		if _, ok := tc.cfg["sysfs"]; !ok {
			tc.cfg["sysfs"] = sysfs
		}
		d := New().(*Detector)
		sched, err := d.Configure(context.Background(), tc.cfg)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: err = %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		var names []string
		for _, p := range d.settings.Load().ports {
			names = append(names, p.Name)
		}
		if got := strings.Join(names, " "); got != tc.ports || sched.Every != tc.every {
			t.Errorf("%s: ports %q every %s; want %q every %s", tc.name, got, sched.Every, tc.ports, tc.every)
		}
	}
}

func TestConfigureSysfs(t *testing.T) {
	for cfg, want := range map[string]string{
		"relative/sys": "option sysfs: \"relative/sys\" is not an absolute path",
		t.TempDir():    "has no class/net",
	} {
		_, err := New().Configure(context.Background(), plugins.Config{"sysfs": cfg})
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("sysfs=%s: err = %v, want %q", cfg, err, want)
		}
	}
	empty := fakeSysfs(t, map[string]string{"class/net/lo/operstate": "unknown", "class/net/lo/carrier": "1"})
	if _, err := New().Configure(context.Background(), plugins.Config{"sysfs": empty}); err == nil || !strings.Contains(err.Error(), "no interface other than lo is up") {
		t.Errorf("a node with only lo: err = %v", err)
	}
}

func TestReadPort(t *testing.T) {
	sysfs := aHost(t)
	for _, tc := range []struct {
		p    port
		want portState
	}{
		{netPort("eno1"), portState{Present: true, Up: true, State: "operstate up, carrier", Changes: 3, RateMbps: 25000}},
		{netPort("eno2"), portState{Present: true, State: "operstate down, no carrier", Changes: 1, RateMbps: -1}},
		{netPort("docker0"), portState{Present: true, Up: true, State: "operstate up, carrier", Changes: -1, RateMbps: -1}},
		{netPort("eno9"), portState{Changes: -1, RateMbps: -1}},
		{ibPort("mlx5_0", "1"), portState{Present: true, Up: true, State: "state 4: ACTIVE, phys_state 5: LinkUp", Changes: 0, RateMbps: 200000}},
		{ibPort("mlx5_0", "2"), portState{Present: true, State: "state 1: DOWN, phys_state 3: Disabled", Changes: -1, RateMbps: -1}},
	} {
		if got := readPort(sysfs, tc.p); got != tc.want {
			t.Errorf("readPort(%s) = %+v, want %+v", tc.p, got, tc.want)
		}
	}
}

func TestInfo(t *testing.T) {
	info, err := New().Info(context.Background())
	if err != nil || info.Name != "nic" || info.Kind != plugins.KindDetector || info.Version != "0.1.0" || info.Summary == "" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	for _, o := range info.Options {
		if o.Help == "" {
			t.Errorf("option %s has no help", o.Name)
		}
	}
}

func TestWatchBeforeConfigure(t *testing.T) {
	if err := New().Watch(context.Background(), nil); err == nil {
		t.Fatal("Watch before Configure: no error")
	}
}

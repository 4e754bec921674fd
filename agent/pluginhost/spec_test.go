package pluginhost

import (
	"reflect"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/plugins"
)

func TestParseSpec(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Spec
		err  string
	}{
		{in: "exec,command=/opt/site/check.sh,interval=30s,timeout=10s", want: Spec{Name: "exec", Config: plugins.Config{"command": "/opt/site/check.sh", "interval": "30s", "timeout": "10s"}}},
		{in: "webhook,url=https://hooks.example/x?a=b", want: Spec{Name: "webhook", Config: plugins.Config{"url": "https://hooks.example/x?a=b"}}},
		{in: "nic,interfaces=eth0,eth1,interval=5s", want: Spec{Name: "nic", Config: plugins.Config{"interfaces": "eth0,eth1", "interval": "5s"}}},
		{in: "/opt/site/plugin,file=/x", want: Spec{Name: "plugin", Path: "/opt/site/plugin", Config: plugins.Config{"file": "/x"}}},
		{in: "disk", want: Spec{Name: "disk", Config: plugins.Config{}}},
		{in: "", err: "no plugin name"},
		{in: "command=x", err: "name comes first"},
		{in: "exec,oops", err: "not key=value"},
		{in: "exec,=v", err: "has no key"},
		{in: "exec,a=1,a=2", err: "given twice"},
	} {
		got, err := ParseSpec(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseSpec(%q) = %v, want an error with %q", tc.in, err, tc.err)
			}
			continue
		}
		tc.want.Raw = tc.in
		if err != nil || !reflect.DeepEqual(got, tc.want) {
			t.Errorf("ParseSpec(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
}

func TestParseSpecsEnv(t *testing.T) {
	specs, err := ParseSpecs(nil, "exec,command=true; webhook,url=http://x")
	if err != nil || len(specs) != 2 || specs[1].Name != "webhook" {
		t.Fatalf("from env: %+v, %v", specs, err)
	}
	specs, err = ParseSpecs([]string{"disk,paths=/tmp"}, "exec,command=true")
	if err != nil || len(specs) != 1 || specs[0].Name != "disk" {
		t.Fatalf("flags win over the env: %+v, %v", specs, err)
	}
}

package opts

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		val  string // "" leaves the option unset
		want time.Duration
		err  string
	}{
		{"", 5 * time.Second, ""},
		{"250ms", 250 * time.Millisecond, ""},
		{"1m30s", 90 * time.Second, ""},
		{"5", 0, `option interval: "5" is not a duration`},
		{"soon", 0, `option interval: "soon" is not a duration`},
		{"0s", 0, `option interval: "0s" must be more than 0`},
		{"-1s", 0, `option interval: "-1s" must be more than 0`},
	} {
		cfg := plugins.Config{}
		if tc.val != "" {
			cfg["interval"] = tc.val
		}
		got, err := Duration(cfg, "interval", "5s")
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("Duration(%q) = %v, %v; want error %q", tc.val, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Duration(%q) = %v, %v; want %v", tc.val, got, err, tc.want)
		}
	}
}

func TestList(t *testing.T) {
	for in, want := range map[string][]string{
		"":                    nil,
		" , ,":                nil,
		"eth0":                {"eth0"},
		"eth0, eth1,,eth0 ":   {"eth0", "eth1"},
		"/a/b,/c , /a/b,/d/e": {"/a/b", "/c", "/d/e"},
	} {
		if got := List(in); !reflect.DeepEqual(got, want) {
			t.Errorf("List(%q) = %q, want %q", in, got, want)
		}
	}
}

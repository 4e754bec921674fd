package disk

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/plugins"
)

func TestConfigure(t *testing.T) {
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		cfg   plugins.Config
		paths []string
		every time.Duration
		err   string
	}{
		{"defaults", plugins.Config{"paths": "/ckpt, /logs/"}, []string{"/ckpt", "/logs"}, 40 * time.Second, ""},
		{"relative", plugins.Config{"paths": "ckpt", "interval": "1s", "timeout": "500ms"}, []string{filepath.Join(wd, "ckpt")}, 1500 * time.Millisecond, ""},
		{"sizes", plugins.Config{"paths": "/c", "min-free": "20GiB", "min-inodes": "10000", "max-write-latency": "500ms"}, []string{"/c"}, 40 * time.Second, ""},
		{"no paths", plugins.Config{}, nil, 0, `option "paths" is required`},
		{"empty list", plugins.Config{"paths": " , "}, nil, 0, "option paths: no directory given"},
		{"bad interval", plugins.Config{"paths": "/c", "interval": "0s"}, nil, 0, `option interval: "0s" must be more than 0`},
		{"bad min-free", plugins.Config{"paths": "/c", "min-free": "5 percent"}, nil, 0, `option min-free: "5 percent" is not a size`},
		{"bad min-inodes", plugins.Config{"paths": "/c", "min-inodes": "1GiB"}, nil, 0, `option min-inodes: "1GiB" is not a count`},
		{"bad latency", plugins.Config{"paths": "/c", "max-write-latency": "fast"}, nil, 0, `option max-write-latency: "fast" is not a duration`},
		{"bad timeout", plugins.Config{"paths": "/c", "timeout": "-2s"}, nil, 0, "option timeout"},
		{"unknown option", plugins.Config{"paths": "/c", "path": "/d"}, nil, 0, `unknown option "path"`},
	} {
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
		if got := d.cfg.Load().paths; !reflect.DeepEqual(got, tc.paths) || sched.Every != tc.every {
			t.Errorf("%s: paths %q every %s; want %q every %s", tc.name, got, sched.Every, tc.paths, tc.every)
		}
	}
}

func TestInfo(t *testing.T) {
	info, err := New().Info(context.Background())
	if err != nil || info.Name != "disk" || info.Kind != plugins.KindDetector || info.Version != "0.1.0" || info.Summary == "" {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	for _, o := range info.Options {
		if o.Help == "" || (o.Default == "" && o.Name != "paths") {
			t.Errorf("option %+v: no help or no default", o)
		}
	}
}

func TestWatchBeforeConfigure(t *testing.T) {
	if err := New().Watch(context.Background(), nil); err == nil {
		t.Fatal("Watch before Configure: no error")
	}
}

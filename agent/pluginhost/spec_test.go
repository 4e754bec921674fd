package pluginhost

import (
	"os"
	"path/filepath"
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

// Edge cases of the --plugin syntax, pinned as ParseSpec reads them.
func TestParseSpecEdges(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   string
		want Spec
		err  string
	}{
		{name: "spaces around the spec and the name", in: "  exec ,command=true ", want: Spec{Name: "exec", Config: plugins.Config{"command": "true"}, Raw: "exec ,command=true"}},
		{name: "spaces around a key", in: "exec, command=true", want: Spec{Name: "exec", Config: plugins.Config{"command": "true"}, Raw: "exec, command=true"}},
		{name: "an empty value", in: "exec,command=", want: Spec{Name: "exec", Config: plugins.Config{"command": ""}, Raw: "exec,command="}},
		{name: "'=' inside a value", in: "exec,command=env A=1 check", want: Spec{Name: "exec", Config: plugins.Config{"command": "env A=1 check"}, Raw: "exec,command=env A=1 check"}},
		{name: "a value continued twice", in: "nic,interfaces=a,b,c", want: Spec{Name: "nic", Config: plugins.Config{"interfaces": "a,b,c"}, Raw: "nic,interfaces=a,b,c"}},
		{name: "a relative path", in: "./bin/check,x=1", want: Spec{Name: "check", Path: "./bin/check", Config: plugins.Config{"x": "1"}, Raw: "./bin/check,x=1"}},
		{name: "a path holding '='", in: "/opt/a=b/check", want: Spec{Name: "check", Path: "/opt/a=b/check", Config: plugins.Config{}, Raw: "/opt/a=b/check"}},
		{name: "only spaces", in: "   ", err: "no plugin name"},
		{name: "a leading comma", in: ",command=x", err: "no plugin name"},
		{name: "an empty part before any key", in: "exec,,command=x", err: `"" is not key=value`},
		{name: "a key given twice after a continued value", in: "nic,interfaces=a,b,interfaces=c", err: `key "interfaces" given twice`},
		{name: "a blank key", in: "exec, =v", err: "has no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseSpec(tc.in)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParseSpecs(t *testing.T) {
	for _, tc := range []struct {
		name  string
		flags []string
		env   string
		want  []string // the names
		err   string
	}{
		{name: "neither", want: nil},
		{name: "a blank env", env: "  ", want: nil},
		{name: "empty entries in the env are skipped", env: ";exec,command=true;; disk ;", want: []string{"exec", "disk"}},
		{name: "empty flags are skipped", flags: []string{"", "disk", " "}, want: []string{"disk"}},
		{name: "flags win over a bad env", flags: []string{"disk"}, env: "exec,oops", want: []string{"disk"}},
		{name: "a bad env spec fails", env: "disk;exec,oops", err: `"oops" is not key=value`},
		{name: "a bad flag fails", flags: []string{"disk", "x,=1"}, err: "has no key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			specs, err := ParseSpecs(tc.flags, tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || specs != nil {
					t.Errorf("got %+v, %v; want no specs and an error with %q", specs, err, tc.err)
				}
				return
			}
			var names []string
			for _, sp := range specs {
				names = append(names, sp.Name)
			}
			if err != nil || !reflect.DeepEqual(names, tc.want) {
				t.Errorf("got %v, %v; want %v", names, err, tc.want)
			}
		})
	}
}

func TestSpecCommand(t *testing.T) {
	dir := t.TempDir()
	ext := filepath.Join(dir, "site-check")
	if err := os.WriteFile(ext, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	withBundled := t.TempDir()
	if err := os.WriteFile(filepath.Join(withBundled, BundledBinary), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	noExec := filepath.Join(dir, "no-x")
	if err := os.WriteFile(noExec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bundledNoExec := t.TempDir()
	if err := os.WriteFile(filepath.Join(bundledNoExec, BundledBinary), []byte("#!/bin/sh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name     string
		sp       Spec
		dir      string
		wantPath string
		wantArgs []string
		err      string
	}{
		{name: "an external plugin runs as it is", sp: Spec{Name: "site-check", Path: ext}, dir: withBundled, wantPath: ext},
		{name: "a missing external plugin", sp: Spec{Name: "gone", Path: filepath.Join(dir, "gone"), Raw: "gone-raw"}, err: "gone: no such file"},
		{name: "a bundled plugin runs through ddp-agent-plugins", sp: Spec{Name: "exec"}, dir: withBundled, wantPath: filepath.Join(withBundled, BundledBinary), wantArgs: []string{"exec"}},
		{name: "no ddp-agent-plugins", sp: Spec{Name: "exec"}, dir: dir, err: "the bundled plugins' binary is missing"},
		// Run, each failed with "permission denied" at every restart.
		{name: "an external plugin without execute bits", sp: Spec{Name: "no-x", Path: noExec}, err: noExec + ": not executable (mode -rw-r--r--): permission denied"},
		{name: "an external plugin that is a directory", sp: Spec{Name: "site", Path: dir}, err: dir + ": a directory, not an executable"},
		{name: "an external plugin that is a device", sp: Spec{Name: "null", Path: os.DevNull}, err: os.DevNull + ": not a regular file"},
		{name: "ddp-agent-plugins without execute bits", sp: Spec{Name: "exec"}, dir: bundledNoExec, err: "the bundled plugins' binary: " + filepath.Join(bundledNoExec, BundledBinary) + ": not executable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, args, err := tc.sp.command(tc.dir)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("got %v, want an error with %q", err, tc.err)
				}
				return
			}
			if err != nil || path != tc.wantPath || !reflect.DeepEqual(args, tc.wantArgs) {
				t.Errorf("got %q %q %v, want %q %q", path, args, err, tc.wantPath, tc.wantArgs)
			}
		})
	}
}

func TestBundledDir(t *testing.T) {
	if got, want := BundledDir("/opt/ddp"), "/opt/ddp"; got != want {
		t.Errorf("with the env: got %v, want %v", got, want)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	exe, _ = filepath.EvalSymlinks(exe)
	if got, want := BundledDir(""), filepath.Dir(exe); got != want {
		t.Errorf("without: got %v, want %v (the executable's directory)", got, want)
	}
}

package nccl

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

func TestParseVersion(t *testing.T) {
	tests := []struct {
		code                int
		major, minor, patch int
		str                 string
	}{
		{2408, 2, 4, 8, "2.4.8"},
		{2708, 2, 7, 8, "2.7.8"},
		{2804, 2, 8, 4, "2.8.4"},
		{20904, 2, 9, 4, "2.9.4"},
		{21003, 2, 10, 3, "2.10.3"},
		{21303, 2, 13, 3, "2.13.3"},
		{21400, 2, 14, 0, "2.14.0"},
		{21903, 2, 19, 3, "2.19.3"},
		{22005, 2, 20, 5, "2.20.5"},
		{22703, 2, 27, 3, "2.27.3"},
	}
	for _, tc := range tests {
		t.Run(tc.str, func(t *testing.T) {
			v := ParseVersion(tc.code)
			if v.Major != tc.major || v.Minor != tc.minor || v.Patch != tc.patch || v.Code != tc.code {
				t.Errorf("ParseVersion(%d): got %+v, want %d.%d.%d", tc.code, v, tc.major, tc.minor, tc.patch)
			}
			if v.String() != tc.str {
				t.Errorf("String: got %q, want %q", v.String(), tc.str)
			}
			if got := VersionCode(tc.major, tc.minor, tc.patch); got != tc.code {
				t.Errorf("VersionCode(%d, %d, %d): got %d, want %d", tc.major, tc.minor, tc.patch, got, tc.code)
			}
		})
	}
	if !ParseVersion(21000).AtLeast(2, 10, 0) || ParseVersion(2804).AtLeast(2, 10, 0) || !ParseVersion(30000).AtLeast(2, 14, 0) {
		t.Error("AtLeast compares wrongly")
	}
}

// TestFeatures: the version the fake reports gates each feature, although
// every symbol is there.
func TestFeatures(t *testing.T) {
	tests := []struct {
		code int
		want Features
	}{
		{2804, Features{}},
		{20904, Features{}},
		{21003, Features{Avg: true, BFloat16: true}},
		{21303, Features{Avg: true, BFloat16: true, LastError: true}},
		{21400, Features{Avg: true, BFloat16: true, LastError: true, NonBlocking: true, Finalize: true}},
		{22005, Features{Avg: true, BFloat16: true, LastError: true, NonBlocking: true, Finalize: true}},
	}
	for _, tc := range tests {
		t.Run(ParseVersion(tc.code).String(), func(t *testing.T) {
			lib, _ := setup(t, tc.code)
			if got := lib.Features(); got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestLoadOrder runs Load in child processes: symbols already in the
// process win over libnccl.so.2 on the library path, which wins over the
// explicit path; without any, the error names all three places.
func TestLoadOrder(t *testing.T) {
	src := fake(t)
	dir := t.TempDir()
	cp := func(name string) string {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		copyFile(t, src, p)
		return p
	}
	preloaded := cp("preloaded/libfake-preloaded.so")
	soname := cp("libpath/libnccl.so.2")
	explicit := cp("explicit/libfake-explicit.so")
	empty := filepath.Join(dir, "libempty.so")
	emptySrc := filepath.Join(dir, "empty.c")
	if err := os.WriteFile(emptySrc, []byte("int not_nccl;\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command("gcc", "-shared", "-fPIC", "-o", empty, emptySrc).CombinedOutput(); err != nil {
		t.Fatalf("gcc: %v\n%s", err, b)
	}

	tests := []struct {
		name       string
		preload    string
		libPath    string // LD_LIBRARY_PATH
		path       string
		wantSource string
		wantErr    []string // substrings of the error
	}{
		{name: "process first", preload: preloaded, libPath: filepath.Dir(soname), path: explicit, wantSource: FromProcess},
		{name: "libnccl.so.2 next", libPath: filepath.Dir(soname), path: explicit, wantSource: FromSoname},
		{name: "explicit path last", path: explicit, wantSource: explicit},
		{name: "none", wantErr: []string{
			"process: ncclGetVersion not found",
			"libnccl.so.2: libnccl.so.2: cannot open shared object file",
			"explicit path: none given (DDP_AGENT_NCCL_LIB is empty)",
		}},
		{name: "missing path", path: dir + "/nope.so", wantErr: []string{
			"process: ncclGetVersion not found",
			"libnccl.so.2: ",
			dir + "/nope.so: " + dir + "/nope.so: cannot open shared object file",
		}},
		{name: "not NCCL", path: empty, wantErr: []string{
			"libnccl.so.2: ",
			empty + ": ncclGetVersion not found",
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := runLoad(t, tc.preload, tc.libPath, tc.path)
			if tc.wantErr == nil {
				if tc.preload == "" && tc.libPath == "" && rep.Source == FromSoname {
					t.Skip("a libnccl.so.2 is installed on this machine (the loader finds it without LD_LIBRARY_PATH); Load rightly takes it before an explicit path")
				}
				if rep.Err != "" || rep.Source != tc.wantSource {
					t.Fatalf("got source %q, error %q; want source %q", rep.Source, rep.Err, tc.wantSource)
				}
				return
			}
			if rep.Err == "" {
				if rep.Source == FromSoname {
					t.Skip("a libnccl.so.2 is installed on this machine")
				}
				t.Fatalf("got source %q, want an error", rep.Source)
			}
			t.Logf("error: %s", rep.Err)
			for _, w := range tc.wantErr {
				if !strings.Contains(rep.Err, w) {
					t.Errorf("error %q lacks %q", rep.Err, w)
				}
			}
			if rep.Status != status.Unavailable {
				t.Errorf("status %d, want %d (unavailable)", rep.Status, status.Unavailable)
			}
		})
	}
}

func runLoad(t *testing.T, preload, libPath, path string) loadReport {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "LD_PRELOAD=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, helperEnv+"=load", helperPreload+"="+preload, helperPath+"="+path)
	if os.Getenv("GORACE") == "" {
		cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0") // the race detector's 1 s pause at exit
	}
	if libPath != "" {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+libPath)
	}
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("helper: %v\n%s", err, out)
	}
	var rep loadReport
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("helper output %q: %v", out, err)
	}
	return rep
}

func copyFile(t *testing.T, from, to string) {
	t.Helper()
	in, err := os.Open(from)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(to)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestStatus(t *testing.T) {
	timeout := fmt.Errorf("ncclAllReduce: %w after 1s", failure.ErrTimeout)
	tests := []struct {
		name string
		err  error
		want int
	}{
		{"nil", nil, status.OK},
		{"closed", fmt.Errorf("x: %w", failure.ErrClosed), status.Closed},
		{"aborted after a timeout", fmt.Errorf("x: %w after: %w", failure.ErrAborted, timeout), status.Aborted},
		{"timeout", timeout, status.Timeout},
		{"invalid", fmt.Errorf("x: %w", failure.ErrInvalid), status.Invalid},
		{"unsupported", fmt.Errorf("x: %w", ErrUnsupported), status.Invalid},
		{"load", &LoadError{}, status.Unavailable},
		{"system error", &Error{Result: SystemError}, status.Peer},
		{"remote error", fmt.Errorf("x: %w", &Error{Result: RemoteError}), status.Peer},
		{"invalid usage", &Error{Result: InvalidUsage}, status.Invalid},
		{"invalid argument", &Error{Result: InvalidArgument}, status.Invalid},
		{"nccl timeout", &Error{Result: Timeout}, status.Timeout},
		{"cuda", &Error{Result: UnhandledCudaError}, status.Internal},
		{"internal", &Error{Result: InternalError}, status.Internal},
		{"other", errors.New("x"), status.Internal},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := Status(tc.err); got != tc.want {
				t.Errorf("Status(%v): got %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}

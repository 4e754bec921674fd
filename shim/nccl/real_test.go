package nccl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/shim/failure"
	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
	"github.com/ddp-agent/ddp-agent/shim/status"
)

// The real NCCL, without a device: TestRealNCCL re-runs this test binary as
// TestRealNCCLHelper (NCCL's state is process-wide: once loaded it stays),
// which loads NCCL the way the environment says and reports as JSON.
const (
	realHelperEnv = "DDP_NCCL_TEST_REAL" // "1" in the helper process
	realInitLimit = 60 * time.Second     // Open's timeout in the helper; init without a device fails at once
)

type realReport struct {
	Source     string   `json:"source"`
	Code       int      `json:"code"`
	Features   Features `json:"features"`
	LoadErr    string   `json:"load_err"`
	IDErr      string   `json:"id_err"`
	InitErr    string   `json:"init_err"`
	InitStatus int      `json:"init_status"`
	InitResult int      `json:"init_result"` // the ncclResult_t of a *Error, -1 otherwise
	InitText   string   `json:"init_text"`   // its ncclGetErrorString
	InitLast   string   `json:"init_last"`   // its ncclGetLastError
	InitMillis int64    `json:"init_ms"`
}

// TestRealNCCLHelper is TestRealNCCL's child process; run alone it returns
// at once.
func TestRealNCCLHelper(t *testing.T) {
	if os.Getenv(realHelperEnv) != "1" {
		return
	}
	var rep realReport
	defer func() {
		b, _ := json.Marshal(rep)
		fmt.Printf("REAL %s\n", b)
	}()
	if p := os.Getenv(helperPreload); p != "" {
		if err := nccltest.Preload(p); err != nil {
			rep.LoadErr = err.Error()
			return
		}
	}
	lib, err := Load(os.Getenv(helperPath))
	if err != nil {
		rep.LoadErr = err.Error()
		return
	}
	rep.Source, rep.Code, rep.Features = lib.Source(), lib.Version().Code, lib.Features()
	if os.Getenv("DDP_NCCL_TEST_INIT") == "" {
		return
	}
	id, err := lib.UniqueID()
	if err != nil {
		rep.IDErr = err.Error()
	}
	start := time.Now()
	c, err := Open(lib, id, 1, 0, realInitLimit)
	rep.InitMillis = time.Since(start).Milliseconds()
	rep.InitResult = -1
	if err == nil {
		c.Close() // a device after all
		return
	}
	rep.InitErr, rep.InitStatus = err.Error(), Status(err)
	var ne *Error
	if errors.As(err, &ne) {
		rep.InitResult, rep.InitText, rep.InitLast = int(ne.Result), ne.Text, ne.Last
	}
}

// realLib returns $DDP_AGENT_TEST_NCCL_LIB, skipping (or failing, with
// $DDP_AGENT_REQUIRE_NCCL) without it.
func realLib(t *testing.T) string {
	t.Helper()
	p := os.Getenv(envLib)
	if p == "" {
		requireOrSkip(t, "%s is not set: no real libnccl.so.2 (pip install nvidia-nccl-cu12; "+
			"the library is nvidia/nccl/lib/libnccl.so.2 in site-packages)", envLib)
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s: %v", envLib, err)
	}
	return p
}

// headerVersion reads NCCL_VERSION_CODE from the nccl.h next to the
// library (a wheel's include/), 0 when there is none.
func headerVersion(lib string) int {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(lib), "..", "include", "nccl.h"))
	if err != nil {
		return 0
	}
	m := regexp.MustCompile(`(?m)^#define NCCL_VERSION_CODE (\d+)`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(string(m[1]))
	return n
}

// runReal runs TestRealNCCLHelper with the given preload, LD_LIBRARY_PATH
// and explicit path, and extra "NAME=value" settings, within limit.
func runReal(t *testing.T, limit time.Duration, preload, libPath, path string, extra ...string) realReport {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestRealNCCLHelper$", "-test.count=1")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "LD_LIBRARY_PATH=") && !strings.HasPrefix(kv, "LD_PRELOAD=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, realHelperEnv+"=1", helperPreload+"="+preload, helperPath+"="+path)
	if os.Getenv("GORACE") == "" {
		cmd.Env = append(cmd.Env, "GORACE=atexit_sleep_ms=0")
	}
	if libPath != "" {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+libPath)
	}
	cmd.Env = append(cmd.Env, extra...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, runErr := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("helper still running after %v (a hang in NCCL?)\n%s", limit, out)
	}
	t.Logf("helper took %v", time.Since(start).Round(time.Millisecond))
	if runErr != nil {
		t.Logf("helper: %v\n%s", runErr, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if j, ok := strings.CutPrefix(line, "REAL "); ok {
			var rep realReport
			if err := json.Unmarshal([]byte(j), &rep); err != nil {
				t.Fatalf("helper report %q: %v", j, err)
			}
			return rep
		}
	}
	t.Fatalf("helper (%v) printed no report:\n%s", runErr, out)
	return realReport{}
}

// TestRealNCCL loads the real libnccl.so.2 ($DDP_AGENT_TEST_NCCL_LIB) through
// each step of Load's order in a child process, reads its version (the
// one its wheel's nccl.h declares) and checks the features it gates.
func TestRealNCCL(t *testing.T) {
	lib := realLib(t)
	want := headerVersion(lib)
	tests := []struct {
		name       string
		preload    string
		libPath    string
		path       string
		wantSource string
	}{
		{name: "explicit path", path: lib, wantSource: lib},
		{name: "libnccl.so.2 on LD_LIBRARY_PATH", libPath: filepath.Dir(lib), path: "/nonexistent/libnccl.so.2", wantSource: FromSoname},
		{name: "process symbols", preload: lib, path: "/nonexistent/libnccl.so.2", wantSource: FromProcess},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rep := runReal(t, 60*time.Second, tc.preload, tc.libPath, tc.path)
			if rep.LoadErr != "" {
				t.Fatalf("Load: %s", rep.LoadErr)
			}
			if tc.preload == "" && tc.libPath == "" && rep.Source == FromSoname {
				// A CUDA image has one in the loader's cache, often of another
				// version than the wheel's; Load rightly takes it first.
				t.Skip("a libnccl.so.2 is installed on this machine (the loader finds it without LD_LIBRARY_PATH)")
			}
			if rep.Source != tc.wantSource {
				t.Errorf("source: got %q, want %q", rep.Source, tc.wantSource)
			}
			v := ParseVersion(rep.Code)
			t.Logf("real NCCL %s (code %d) from %s: %+v", v, rep.Code, rep.Source, rep.Features)
			if want != 0 && rep.Code != want {
				t.Errorf("version code: got %d, want %d (NCCL_VERSION_CODE of the wheel's nccl.h)", rep.Code, want)
			}
			if !v.AtLeast(2, 18, 0) {
				t.Errorf("version %s: the real-NCCL tests expect 2.18 or newer", v)
			}
			// Every feature from 2.14 on, and each needs its symbol: all there.
			all := Features{Avg: true, BFloat16: true, LastError: true, NonBlocking: true, Finalize: true}
			if rep.Features != all {
				t.Errorf("features: got %+v, want %+v", rep.Features, all)
			}
		})
	}
}

// TestRealNCCLInitNoDevice: on a machine without a CUDA device, opening a
// one-rank communicator on the real NCCL fails promptly with NCCL's own
// result and message (ncclGetErrorString, and ncclGetLastError's detail),
// not a crash or a hang. Skipped where a device is present.
func TestRealNCCLInitNoDevice(t *testing.T) {
	lib := realLib(t)
	if _, err := os.Stat("/dev/nvidia0"); err == nil {
		t.Skip("/dev/nvidia0 exists: this machine has a device, init would succeed")
	}
	rep := runReal(t, realInitLimit+30*time.Second, "", "", lib, "DDP_NCCL_TEST_INIT=1")
	if rep.LoadErr != "" {
		t.Fatalf("Load: %s", rep.LoadErr)
	}
	t.Logf("ncclGetUniqueId: %q", rep.IDErr)
	t.Logf("Open after %d ms: %s (status %d)", rep.InitMillis, rep.InitErr, rep.InitStatus)
	if rep.InitErr == "" {
		t.Fatal("Open succeeded without a CUDA device")
	}
	if rep.InitResult < 0 {
		t.Fatalf("Open's error is not NCCL's own (*nccl.Error): %s", rep.InitErr)
	}
	if strings.Contains(rep.InitErr, failure.ErrTimeout.Error()) || time.Duration(rep.InitMillis)*time.Millisecond >= realInitLimit {
		t.Errorf("Open waited for its timeout instead of failing at once: %s", rep.InitErr)
	}
	if !strings.Contains(rep.InitErr, "ncclCommInitRank") {
		t.Errorf("error %q does not name the NCCL call", rep.InitErr)
	}
	if rep.InitText == "" || rep.InitLast == "" {
		t.Errorf("error %q lacks NCCL's words: ncclGetErrorString %q, ncclGetLastError %q",
			rep.InitErr, rep.InitText, rep.InitLast)
	}
	if rep.InitStatus == status.OK {
		t.Errorf("status OK for an error")
	}
}

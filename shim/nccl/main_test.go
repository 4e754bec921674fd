package nccl

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/leaktest"
	"github.com/ddp-agent/ddp-agent/shim/nccl/nccltest"
)

// Environment of the helper process that TestLoadOrder re-runs this test
// binary as: it preloads helperPreload (if set), calls Load(helperPath) and
// prints a loadReport as JSON.
const (
	helperEnv     = "DDP_NCCL_TEST_HELPER"
	helperPreload = "DDP_NCCL_TEST_PRELOAD"
	helperPath    = "DDP_NCCL_TEST_PATH"
)

type loadReport struct {
	Source  string `json:"source"`
	Version string `json:"version"`
	Err     string `json:"err"`
	Status  int    `json:"status"`
}

// fakeLib is the fake libnccl.so.2 that TestMain built, "" without gcc.
var fakeLib string

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "load" {
		os.Exit(helperLoad())
	}
	dir, err := os.MkdirTemp("", "fakenccl-build-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fakeLib, err = nccltest.Build(dir)
	if err != nil && !errors.Is(err, nccltest.ErrNoCompiler) {
		fmt.Fprintln(os.Stderr, err)
		os.RemoveAll(dir)
		os.Exit(2)
	}
	code := m.Run()
	if code == 0 {
		if err := leaktest.Check("shim/nccl", 5*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

func helperLoad() int {
	if p := os.Getenv(helperPreload); p != "" {
		if err := nccltest.Preload(p); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	var rep loadReport
	lib, err := Load(os.Getenv(helperPath))
	if err != nil {
		rep.Err = err.Error()
		rep.Status = Status(err)
	} else {
		rep.Source = lib.Source()
		rep.Version = lib.Version().String()
	}
	b, _ := json.Marshal(rep)
	fmt.Printf("%s\n", b)
	return 0
}

// fake returns the fake NCCL's path, skipping the test without gcc.
func fake(t *testing.T) string {
	t.Helper()
	if fakeLib == "" {
		t.Skip("gcc not found: no fake NCCL")
	}
	return fakeLib
}

// setup loads the fake reporting version code, with its rendezvous
// directory and record file in the test's temporary directory, and returns
// the record file's path. Extra knobs are "NAME=value".
func setup(t *testing.T, code int, knobs ...string) (*Lib, string) {
	t.Helper()
	nccltest.SkipIfInstalled(t, nccltest.LibName)
	path := fake(t)
	dir := t.TempDir()
	rec := dir + "/record"
	t.Setenv("FAKE_NCCL_VERSION", fmt.Sprint(code))
	t.Setenv("FAKE_NCCL_DIR", dir)
	t.Setenv("FAKE_NCCL_RECORD", rec)
	for _, name := range []string{"FAKE_NCCL_INPROGRESS", "FAKE_NCCL_FAIL", "FAKE_NCCL_HANG"} {
		t.Setenv(name, "")
	}
	for _, kv := range knobs {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	lib, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := lib.Version().Code; got != code {
		t.Fatalf("version code %d, want %d", got, code)
	}
	return lib, rec
}

// event is one line of the fake's record file: its first word and its
// key=value pairs.
type event struct {
	name string
	kv   map[string]string
}

func records(t *testing.T, path string) []event {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var evs []event
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 {
			continue
		}
		ev := event{name: f[0], kv: map[string]string{}}
		for _, p := range f[1:] {
			k, v, _ := strings.Cut(p, "=")
			ev.kv[k] = v
		}
		evs = append(evs, ev)
	}
	return evs
}

// find returns the events named name whose keys match match ("k=v").
func find(evs []event, name string, match ...string) []event {
	var out []event
next:
	for _, ev := range evs {
		if ev.name != name {
			continue
		}
		for _, m := range match {
			k, v, _ := strings.Cut(m, "=")
			if ev.kv[k] != v {
				continue next
			}
		}
		out = append(out, ev)
	}
	return out
}

// openAll opens n ranks concurrently, as n threads of one job.
func openAll(t *testing.T, lib *Lib, n int, timeout time.Duration) []*Comm {
	t.Helper()
	id, err := lib.UniqueID()
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*Comm, n)
	errs := each(n, func(r int) (err error) {
		comms[r], err = Open(lib, id, n, r, timeout)
		return err
	})
	for r, err := range errs {
		if err != nil {
			for _, c := range comms {
				if c != nil {
					c.Close()
				}
			}
			t.Fatalf("open rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

// each runs fn(0..n-1) on n goroutines and returns their errors.
func each(n int, fn func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[r] = fn(r)
		}()
	}
	wg.Wait()
	return errs
}

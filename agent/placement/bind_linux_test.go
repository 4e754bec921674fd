package placement

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/ddp-agent/ddp-agent/nvml"
)

// helperEnv makes the test binary a helper: "bind" runs Exec on its
// arguments (the trampoline, which then execs the test binary again),
// "report" prints what the process was bound to.
const helperEnv = "PLACEMENT_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "bind":
		os.Setenv(helperEnv, "report") // Exec passes os.Environ() on
		err := Exec(os.Args[1:])
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	case "report":
		if err := report(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(4)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// report prints the process's Cpus_allowed_list line and the memory
// policy of each anonymous mapping, "policy <p>" a line.
func report() error {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return err
	}
	for line := range strings.Lines(string(status)) {
		if strings.HasPrefix(line, "Cpus_allowed_list:") {
			fmt.Print(line)
		}
	}
	maps, err := os.ReadFile("/proc/self/numa_maps")
	if err != nil {
		return err
	}
	sc := bufio.NewScanner(bytes.NewReader(maps))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && (strings.Contains(sc.Text(), " anon=") || strings.Contains(sc.Text(), " heap")) {
			fmt.Println("policy", f[1])
		}
	}
	return sc.Err()
}

// trampoline runs the test binary through Exec with args before "--" and
// returns what the exec'd binary reports, or Exec's error output.
func trampoline(t *testing.T, args ...string) (out string, errOut string, err error) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, append(args, "--", self)...)
	cmd.Env = append(os.Environ(), helperEnv+"=bind")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err = cmd.Run()
	return stdout.String(), strings.TrimSpace(stderr.String()), err
}

func TestExec(t *testing.T) {
	allowed, err := Affinity()
	if err != nil {
		t.Fatal(err)
	}
	first, last := allowed[0], allowed[len(allowed)-1]
	for _, tc := range []struct {
		name   string
		args   []string
		cpus   nvml.CPUList
		policy string
	}{
		{"strict", []string{"--cpus", fmt.Sprint(last), "--mem", "0", "--strict"}, nvml.CPUList{last}, "bind:0"},
		{"preferred", []string{"--cpus", fmt.Sprint(first), "--mem", "0"}, nvml.CPUList{first}, "prefer:0"},
		{"CPUs only", []string{"--cpus", fmt.Sprint(last)}, nvml.CPUList{last}, "default"},
		{"memory only", []string{"--mem", "0", "--strict"}, allowed, "bind:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := trampoline(t, tc.args...)
			if err != nil {
				t.Fatalf("%v: %s", err, errOut)
			}
			var policies []string
			gotCPUs := ""
			for line := range strings.Lines(out) {
				if s, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
					gotCPUs = strings.TrimSpace(s)
				}
				if p, ok := strings.CutPrefix(strings.TrimSpace(line), "policy "); ok {
					policies = append(policies, p)
				}
			}
			if gotCPUs != tc.cpus.String() {
				t.Errorf("Cpus_allowed_list: got %q, want %q", gotCPUs, tc.cpus)
			}
			if len(policies) == 0 {
				t.Fatalf("no anonymous mappings in numa_maps:\n%s", out)
			}
			for _, p := range policies {
				if p != tc.policy {
					t.Errorf("numa_maps policy: got %v, want %s everywhere", policies, tc.policy)
					break
				}
			}
		})
	}
}

// TestExecFailures runs the failing bindings in a helper process, so
// that no test thread is left bound.
func TestExecFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"CPU not there", []string{"--cpus", "4095"}, "bind worker to CPUs 4095: invalid argument"},
		{"node not there", []string{"--mem", "1000"}, "bind worker memory (prefer) to NUMA node 1000: invalid argument"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, err := trampoline(t, tc.args...)
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 3 {
				t.Fatalf("got %v (output %q), want exit status 3", err, out)
			}
			if errOut != tc.want {
				t.Errorf("got error %q, want %q", errOut, tc.want)
			}
		})
	}
}

func TestExecBadArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"nothing", nil, "no command"},
		{"no command", []string{"--cpus", "0", "--"}, "no command"},
		{"bad CPUs", []string{"--cpus", "0-x", "--", "true"}, `--cpus: cpu list "0-x"`},
		{"bad node", []string{"--mem", "-2", "--", "true"}, "--mem -2"},
		{"strict alone", []string{"--strict", "--", "true"}, "--strict needs --mem"},
		{"unknown flag", []string{"--cpu", "0", "--", "true"}, "flag provided but not defined: -cpu"},
		{"no such command", []string{"--cpus", "0", "--", "ddp-agent-no-such-command"}, `"ddp-agent-no-such-command": executable file not found`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := Exec(tc.args)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestAffinity(t *testing.T) {
	got, err := Affinity()
	if err != nil {
		t.Fatal(err)
	}
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(status)) {
		if s, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			want, err := nvml.ParseCPUList(s)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Errorf("got %s, want %s", got, want)
			}
			return
		}
	}
	t.Fatal("no Cpus_allowed_list in /proc/self/status")
}

// TestMemsAllowed: the nodes of this process's cpuset; on every Linux
// machine at least node 0's memory, or some node's, is allowed.
func TestMemsAllowed(t *testing.T) {
	got, err := MemsAllowed()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("no memory node allowed")
	}
	entries, err := os.ReadDir("/sys/devices/system/node")
	if err != nil {
		t.Skip("no NUMA nodes in sysfs")
	}
	for _, n := range got {
		found := false
		for _, e := range entries {
			found = found || e.Name() == fmt.Sprintf("node%d", n)
		}
		if !found {
			t.Errorf("node %d allowed but not in /sys/devices/system/node", n)
		}
	}
}

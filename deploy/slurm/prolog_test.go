package slurm

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestPrologChecks runs prolog.sh and epilog.sh without Slurm (scontrol
// replaced by a script that records its arguments): each check's exit code
// maps as the exec plugin's does, a check exiting 3 drains the node and
// fails the prolog, a check past its timeout is killed and only warned
// about, the epilog turns an agent's exit-3 note into a drain (in the drain
// directory of the site's settings file, over its environment's), and an
// epilog installed without prolog.sh beside it fails, so that Slurm drains
// the node.
func TestPrologChecks(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	tests := []struct {
		name      string
		checks    map[string]string // file name: script body
		hook      string            // prolog or epilog
		note      bool              // an exit-3 note from ddp-agent.sbatch
		site      bool              // a settings file names the drain dir; the environment another
		alone     bool              // the hook is installed without prolog.sh beside it
		wantExit  int
		wantDrain string // part of scontrol's arguments; "" means no drain
		wantLog   string
	}{
		{name: "no checks", hook: "prolog"},
		{name: "ok", hook: "prolog", checks: map[string]string{"a": "echo fine; exit 0"}},
		{name: "warning", hook: "prolog", checks: map[string]string{"a": "echo disk slow; exit 1"}, wantLog: "check a: warning (exit 1): disk slow"},
		{name: "drain", hook: "prolog", checks: map[string]string{"a": "echo ok", "b": "echo GPU 3 lost; exit 3"},
			wantExit: 1, wantDrain: "Reason=ddp-agent: check b: GPU 3 lost"},
		{name: "timeout", hook: "prolog", checks: map[string]string{"a": "sleep 30 & sleep 30"}, wantLog: "ran past 1s"},
		{name: "a background child goes with its check", hook: "prolog",
			checks: map[string]string{"a": "sleep 60 &\necho $! >\"$DDP_AGENT_CHECKS_DIR/../bg.pid\"; echo ok"}},
		{name: "not executable is skipped", hook: "prolog", checks: map[string]string{"a.txt": "exit 3"}},
		{name: "epilog drains on the agent's note", hook: "epilog", note: true,
			wantDrain: "Reason=ddp-agent: ddp-agent exit 3 in job 42"},
		{name: "epilog runs the checks", hook: "epilog", checks: map[string]string{"a": "echo NIC down; exit 3"},
			wantDrain: "Reason=ddp-agent: check a: NIC down"},
		{name: "epilog reads the drain dir from the site's file", hook: "epilog", note: true, site: true,
			wantDrain: "Reason=ddp-agent: ddp-agent exit 3 in job 42"},
		{name: "epilog without prolog.sh fails", hook: "epilog", alone: true, checks: map[string]string{"a": "echo ok"},
			wantExit: 1, wantLog: "prolog.sh is missing or not executable"},
		{name: "epilog without prolog.sh still drains on the note", hook: "epilog", alone: true, note: true,
			wantExit: 1, wantDrain: "Reason=ddp-agent: ddp-agent exit 3 in job 42", wantLog: "failing so that Slurm drains n7"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			checks, drain := filepath.Join(dir, "checks"), filepath.Join(dir, "drain")
			for _, d := range []string{checks, drain} {
				if err := os.Mkdir(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			for name, body := range tc.checks {
				mode := os.FileMode(0o755)
				if strings.HasSuffix(name, ".txt") {
					mode = 0o644
				}
				if err := os.WriteFile(filepath.Join(checks, name), []byte("#!/bin/sh\n"+body+"\n"), mode); err != nil {
					t.Fatal(err)
				}
			}
			if tc.note {
				if err := os.WriteFile(filepath.Join(drain, "ddp-agent-drain.42.n7"), []byte("ddp-agent exit 3 in job 42\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			scontrol := filepath.Join(dir, "scontrol")
			record := filepath.Join(dir, "scontrol.args")
			if err := os.WriteFile(scontrol, []byte("#!/bin/sh\necho \"$*\" >>"+record+"\n"), 0o755); err != nil {
				t.Fatal(err)
			}
			hook, envDrain, defaults := "./"+tc.hook+".sh", drain, filepath.Join(dir, "defaults")
			if tc.site {
				envDrain = filepath.Join(dir, "elsewhere")
				if err := os.WriteFile(defaults, []byte("DDP_AGENT_DRAIN_DIR="+drain+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if tc.alone {
				hook = installAlone(t, hook, filepath.Join(dir, "installed"))
			}
			cmd := exec.Command(hook)
			cmd.Env = append(cleanEnv(), "DDP_AGENT_CHECKS_DIR="+checks, "DDP_AGENT_DRAIN_DIR="+envDrain, "DDP_AGENT_SLURM_DEFAULTS="+defaults,
				"DDP_AGENT_SCONTROL="+scontrol, "DDP_AGENT_CHECK_TIMEOUT=1", "SLURMD_NODENAME=n7",
				"SLURM_JOB_ID=42", "SLURM_JOB_UID="+strconv.Itoa(os.Getuid()), "SLURM_SCRIPT_CONTEXT="+tc.hook+"_slurmd")
			out, err := cmd.CombinedOutput()
			code := 0
			if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantExit {
				t.Errorf("exit %d, want %d; output:\n%s", code, tc.wantExit, out)
			}
			args, _ := os.ReadFile(record)
			switch {
			case tc.wantDrain == "" && len(args) > 0:
				t.Errorf("scontrol %s, want no drain", args)
			case tc.wantDrain != "" && !strings.Contains(string(args), "update NodeName=n7 State=DRAIN "+tc.wantDrain):
				t.Errorf("scontrol got %q, want a drain with %q", args, tc.wantDrain)
			}
			if !strings.Contains(string(out), tc.wantLog) {
				t.Errorf("output lacks %q:\n%s", tc.wantLog, out)
			}
			if pid, err := os.ReadFile(filepath.Join(dir, "bg.pid")); err != nil && strings.Contains(tc.name, "background") {
				t.Errorf("the check did not run: %v", err)
			} else if err == nil {
				if _, err := os.Stat("/proc/" + strings.TrimSpace(string(pid)) + "/cmdline"); err == nil {
					stat, _ := os.ReadFile("/proc/" + strings.TrimSpace(string(pid)) + "/stat")
					if !strings.Contains(string(stat), ") Z") {
						t.Errorf("the check's background child %s outlived it", pid)
					}
				}
			}
			if tc.note {
				if _, err := os.Stat(filepath.Join(drain, "ddp-agent-drain.42.n7")); !os.IsNotExist(err) {
					t.Errorf("the note is still there (%v)", err)
				}
			}
		})
	}
}

// installAlone copies the script to dir, without prolog.sh beside it, and
// returns the copy's path.
func installAlone(t *testing.T, script, dir string) string {
	t.Helper()
	data, err := os.ReadFile(script)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	installed := filepath.Join(dir, filepath.Base(script))
	if err := os.WriteFile(installed, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return installed
}

// TestInstallNames: the files of this directory name one install layout,
// /etc/slurm/ddp-agent/prolog.sh and epilog.sh, the names epilog.sh runs
// prolog.sh by (its own directory); an older spelling, ddp-agent-prolog.sh,
// installed as told, left the epilog unable to find it.
func TestInstallNames(t *testing.T) {
	files, err := filepath.Glob("*")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"Prolog": "/etc/slurm/ddp-agent/prolog.sh", "Epilog": "/etc/slurm/ddp-agent/epilog.sh"}
	seen := 0
	for _, f := range files {
		if !strings.HasSuffix(f, ".sh") && !strings.HasSuffix(f, ".sbatch") && f != "README.md" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range installRE.FindAllStringSubmatch(string(data), -1) {
			seen++
			if m[2] != want[m[1]] {
				t.Errorf("%s: %s=%s, want %s=%s", f, m[1], m[2], m[1], want[m[1]])
			}
		}
		for _, old := range []string{"ddp-agent-prolog.sh", "ddp-agent-epilog.sh"} {
			if strings.Contains(string(data), old) {
				t.Errorf("%s names %s: install as %s", f, old, want["Prolog"])
			}
		}
	}
	if seen < 4 { // README's slurm.conf, and each script's header
		t.Errorf("found %d Prolog=/Epilog= lines, want at least 4", seen)
	}
}

var installRE = regexp.MustCompile(`\b(Prolog|Epilog)=([^\s,)]+)`)

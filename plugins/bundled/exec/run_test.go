package exec

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ddp-agent/ddp-agent/plugins/detector"
)

func TestExitCodes(t *testing.T) {
	for _, tc := range []struct {
		command string
		sev     detector.Severity
		act     detector.Action
		msg     string
	}{
		{"echo all good; echo second line", detector.SeverityOK, detector.ActionNone, "all good"},
		{"true", detector.SeverityOK, detector.ActionNone, "exec check passed"},
		{"echo '  ECC errors rising  '; exit 1", detector.SeverityWarning, detector.ActionWarn, "ECC errors rising"},
		{"echo fabric degraded; exit 2", detector.SeverityError, detector.ActionRestartWorkers, "fabric degraded"},
		{"printf 'maintenance window'; exit 3", detector.SeverityError, detector.ActionDrainNode, "maintenance window"},
		{"exit 3", detector.SeverityError, detector.ActionDrainNode, "exec check asks to drain the node (exit 3)"},
		{"echo odd; exit 7", detector.SeverityWarning, detector.ActionWarn, "exec check exited 7, which is none of 0 ok, 1 warn, 2 restart workers, 3 drain node: odd"},
		{"/no/such/check", detector.SeverityWarning, detector.ActionWarn, "exec check exited 127"},
		{"kill -9 $$", detector.SeverityWarning, detector.ActionWarn, "exec check died of signal 9 (killed)"},
	} {
		t.Run(tc.command, func(t *testing.T) {
			f := verdict(run(context.Background(), tc.command, 10*time.Second), 10*time.Second)
			if f.Severity != tc.sev || f.Action != tc.act || !strings.HasPrefix(f.Message, tc.msg) || f.Subject != "node" || f.Time.IsZero() {
				t.Errorf("finding %+v, want %v/%v %q...", f, tc.sev, tc.act, tc.msg)
			}
		})
	}
}

func TestCannotStart(t *testing.T) {
	f := verdict(result{exitCode: -1, startErr: os.ErrNotExist}, time.Second)
	if f.Severity != detector.SeverityWarning || f.Action != detector.ActionWarn || !strings.Contains(f.Message, "cannot start") {
		t.Errorf("finding %+v", f)
	}
}

// TestTimeoutKillsTheGroup: a check that outlives its timeout is a
// warning, and its children die with it.
func TestTimeoutKillsTheGroup(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	res := run(context.Background(), "sleep 60 & echo $! > "+pidFile+"; echo waiting; wait", 300*time.Millisecond)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %v", took)
	}
	f := verdict(res, 300*time.Millisecond)
	if f.Severity != detector.SeverityWarning || !strings.Contains(f.Message, "timed out after 300ms") {
		t.Errorf("finding %+v, want a timeout warning", f)
	}
	assertGone(t, pidFile)
}

// TestLeftoversKilled: a check that exits leaving a child behind (that
// holds its stdout) ends at once, and the child dies.
func TestLeftoversKilled(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	res := run(context.Background(), "sleep 60 & echo $! > "+pidFile+"; echo fine", 10*time.Second)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %v", took)
	}
	if f := verdict(res, time.Second); f.Severity != detector.SeverityOK || f.Message != "fine" {
		t.Errorf("finding %+v", f)
	}
	assertGone(t, pidFile)
}

// TestEscapedChildDoesNotHoldTheCheck: a child that left the process group
// and keeps stdout open costs the check pipeGrace, not its life.
func TestEscapedChildDoesNotHoldTheCheck(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	start := time.Now()
	res := run(context.Background(), "setsid sh -c 'echo $$ > "+pidFile+"; exec sleep 60' & "+
		"while [ ! -s "+pidFile+" ]; do sleep 0.01; done; printf partial", 10*time.Second)
	t.Cleanup(func() { killPidFile(pidFile) })
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %v", took)
	}
	if f := verdict(res, time.Second); f.Message != "partial" {
		t.Errorf("finding %+v", f)
	}
	if !fileHasPid(pidFile) {
		t.Fatal("the escaped child wrote no pid")
	}
}

func TestCtxEndKillsTheCheck(t *testing.T) {
	pidFile := filepath.Join(t.TempDir(), "pid")
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		for !fileHasPid(pidFile) {
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
	}()
	start := time.Now()
	run(ctx, "sleep 60 & echo $! > "+pidFile+"; wait", time.Hour)
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the check took %v after its ctx ended", took)
	}
	assertGone(t, pidFile)
}

func TestHugeAndGarbageOutput(t *testing.T) {
	for _, command := range []string{
		"head -c 50000000 /dev/zero; exit 1",          // 50 MB, no newline
		"head -c 5000000 /dev/urandom; exit 1",        // binary garbage
		"yes 'a long line' | head -n 2000000; exit 1", // many lines
		"printf '\\377\\376bad \\033[31mutf8\\n'; exit 1",
	} {
		t.Run(command, func(t *testing.T) {
			start := time.Now()
			f := verdict(run(context.Background(), command, 30*time.Second), 30*time.Second)
			if took := time.Since(start); took > 20*time.Second {
				t.Errorf("the check took %v", took)
			}
			if f.Action != detector.ActionWarn || len(f.Message) > 3*messageLimit || !utf8.ValidString(f.Message) || strings.ContainsAny(f.Message, "\n\r\x00\x1b") {
				t.Errorf("finding %v/%v with a %d-byte message %q", f.Severity, f.Action, len(f.Message), f.Message)
			}
		})
	}
}

func TestCheckEnvLosesThePluginsOwn(t *testing.T) {
	t.Setenv("DDP_AGENT_PLUGIN", "cookie")
	t.Setenv("PLUGIN_CLIENT_CERT", "cert")
	t.Setenv("SITE_VAR", "kept")
	f := verdict(run(context.Background(), `echo "${DDP_AGENT_PLUGIN:-none} ${PLUGIN_CLIENT_CERT:-none} $SITE_VAR"`, 10*time.Second), time.Second)
	if f.Message != "none none kept" {
		t.Errorf("the check saw %q", f.Message)
	}
}

func fileHasPid(path string) bool {
	b, err := os.ReadFile(path)
	return err == nil && strings.HasSuffix(string(b), "\n")
}

func assertGone(t *testing.T, pidFile string) {
	t.Helper()
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatalf("the check wrote no pid: %v", err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("the check's child %d is still running", pid)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func killPidFile(path string) {
	b, _ := os.ReadFile(path)
	if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
		p, _ := os.FindProcess(pid)
		_ = p.Kill()
	}
}

// alive reports whether pid runs; a zombie (exited, not yet reaped by
// whoever adopted it) does not.
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}

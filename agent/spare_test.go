package agent

import (
	"strings"
	"syscall"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
	"github.com/ddp-agent/ddp-agent/agent/telemetry"
	"github.com/ddp-agent/ddp-agent/agent/telemetry/watch"
)

func TestReplaceable(t *testing.T) {
	tests := []struct {
		name       string
		exit       supervisor.WorkerExitError
		idle       int
		agentStore bool
		want       string // "" when a spare takes the rank
	}{
		{"killed", supervisor.WorkerExitError{Rank: 3, Code: -1, Signal: syscall.SIGKILL}, 1, true, ""},
		{"crashed", supervisor.WorkerExitError{Rank: 1, Code: -1, Signal: syscall.SIGSEGV}, 2, true, ""},
		{"exited", supervisor.WorkerExitError{Rank: 1, Code: 1}, 1, true, "exited with code 1"},
		{"rank 0, its own store", supervisor.WorkerExitError{Rank: 0, Code: -1, Signal: syscall.SIGKILL}, 1, false,
			"rank 0's process served the job's store"},
		{"rank 0, the agent's store", supervisor.WorkerExitError{Rank: 0, Code: -1, Signal: syscall.SIGKILL}, 1, true, ""},
		{"no spare", supervisor.WorkerExitError{Rank: 2, Code: -1, Signal: syscall.SIGKILL}, 0, true, "no warm spare is idle"},
	}
	for _, tc := range tests {
		ok, why := replaceable(&tc.exit, tc.idle, tc.agentStore)
		if ok != (tc.want == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: got %v %q, want %q", tc.name, ok, why, tc.want)
		}
	}
}

func TestHungReplaceable(t *testing.T) {
	tests := []struct {
		name               string
		missing            []int
		first, nproc, idle int
		agentStore         bool
		want               string
	}{
		{"local", []int{5}, 4, 4, 1, true, ""},
		{"two local", []int{5, 6}, 4, 4, 2, true, ""},
		{"elsewhere", []int{9}, 4, 4, 1, true, "another node"},
		{"rank 0, its own store", []int{0}, 0, 4, 1, false, "rank 0's process"},
		{"rank 0, the agent's store", []int{0, 1}, 0, 4, 2, true, ""},
		{"too few spares", []int{5, 6}, 4, 4, 1, true, "2 ranks hung, 1 warm spares idle"},
		{"none named", nil, 0, 4, 1, true, "no rank"},
	}
	for _, tc := range tests {
		ok, why := hungReplaceable(tc.missing, tc.first, tc.nproc, tc.idle, tc.agentStore)
		if ok != (tc.want == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: got %v %q, want %q", tc.name, ok, why, tc.want)
		}
	}
}

func TestDecideHang(t *testing.T) {
	hang := func(node string, remote bool, missing ...int) *watch.HangError {
		return &watch.HangError{Hang: telemetry.Hang{Missing: missing}, Node: node, Remote: remote}
	}
	tests := []struct {
		name        string
		he          *watch.HangError
		first, idle int
		want        hangAction
		why         string
	}{
		{"here", hang("", false, 1), 0, 1, hangKill, ""},
		{"leader, one other node", hang("b", false, 5), 0, 1, hangDefer, ""},
		{"leader, here and there", hang("", false, 1, 5), 0, 1, hangRestart, "another node"},
		{"follower, its ranks", hang("", true, 5, 6), 4, 2, hangKill, ""},
		{"follower, too few spares", hang("", true, 5, 6), 4, 1, hangRestart, "2 ranks hung, 1 warm spares idle"},
		{"follower, not its ranks alone", hang("", true, 5, 9), 4, 2, hangLeave, ""},
		{"follower, none of its ranks", hang("", true, 1), 4, 1, hangLeave, ""},
	}
	for _, tc := range tests {
		got, why := decideHang(tc.he, tc.first, 4, tc.idle, true)
		if got != tc.want || !strings.Contains(why, tc.why) {
			t.Errorf("%s: got %v %q, want %v %q", tc.name, got, why, tc.want, tc.why)
		}
	}
}

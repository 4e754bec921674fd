package agent

import (
	"strings"
	"syscall"
	"testing"

	"github.com/ddp-agent/ddp-agent/agent/supervisor"
)

func TestReplaceable(t *testing.T) {
	tests := []struct {
		name string
		exit supervisor.WorkerExitError
		idle int
		want string // "" when a spare takes the rank
	}{
		{"killed", supervisor.WorkerExitError{Rank: 3, Code: -1, Signal: syscall.SIGKILL}, 1, ""},
		{"crashed", supervisor.WorkerExitError{Rank: 1, Code: -1, Signal: syscall.SIGSEGV}, 2, ""},
		{"exited", supervisor.WorkerExitError{Rank: 1, Code: 1}, 1, "exited with code 1"},
		{"rank 0", supervisor.WorkerExitError{Rank: 0, Code: -1, Signal: syscall.SIGKILL}, 1, "rank 0's process served the job's store"},
		{"no spare", supervisor.WorkerExitError{Rank: 2, Code: -1, Signal: syscall.SIGKILL}, 0, "no warm spare is idle"},
	}
	for _, tc := range tests {
		ok, why := replaceable(&tc.exit, tc.idle)
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
		want               string
	}{
		{"local", []int{5}, 4, 4, 1, ""},
		{"two local", []int{5, 6}, 4, 4, 2, ""},
		{"elsewhere", []int{9}, 4, 4, 1, "another node"},
		{"rank 0", []int{0}, 0, 4, 1, "rank 0's process"},
		{"too few spares", []int{5, 6}, 4, 4, 1, "2 ranks hung, 1 warm spares idle"},
		{"none named", nil, 0, 4, 1, "no rank"},
	}
	for _, tc := range tests {
		ok, why := hungReplaceable(tc.missing, tc.first, tc.nproc, tc.idle)
		if ok != (tc.want == "") || !strings.Contains(why, tc.want) {
			t.Errorf("%s: got %v %q, want %q", tc.name, ok, why, tc.want)
		}
	}
}

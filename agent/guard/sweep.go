package guard

import (
	"bytes"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// sweep kills, with SIGKILL, every process but self whose environment
// carries id, round after round (a process may fork while its parent is
// being killed) until a round finds none, or rounds are done; it returns
// the pids it killed.
//
// It stops only after two rounds in a row found none: a process in the
// middle of an exec shows no environment for that moment, and one round
// alone missed it on a loaded machine.
func sweep(id string, self, rounds int, pause time.Duration) ([]int, error) {
	var killed, found []int
	empty := 0
	for range rounds {
		found = marked(id, self)
		for _, pid := range found {
			if syscall.Kill(pid, syscall.SIGKILL) == nil && !slices.Contains(killed, pid) {
				killed = append(killed, pid)
			}
		}
		if empty = empty + 1; len(found) > 0 {
			empty = 0
		}
		if empty == 2 {
			return killed, nil
		}
		time.Sleep(pause)
	}
	if len(found) == 0 {
		return killed, nil
	}
	return killed, &leftError{pids: found}
}

// marked lists the live processes, but self, whose environment carries id.
// Only the user's own are readable (and killable): the rest are skipped.
// A zombie (its environment gone) is not listed: it is dead already.
func marked(id string, self int) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		if carries(env, id) && !zombie(e.Name()) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// carries reports whether environ (a /proc/<pid>/environ: NUL-separated
// KEY=VALUE) holds envname.Instance with id among its ids.
func carries(environ []byte, id string) bool {
	prefix := []byte(envname.Instance + "=")
	for kv := range bytes.SplitSeq(environ, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, prefix); ok {
			for have := range strings.SplitSeq(string(v), ",") {
				if have == id {
					return true
				}
			}
		}
	}
	return false
}

// zombie reports whether the process has exited and waits to be reaped
// (or is gone): there is nothing left to kill.
func zombie(pid string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] == 'Z' || b[i+2] == 'X'
}

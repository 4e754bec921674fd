package supervisor

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// RankOf returns the global rank of the worker that pid is, or descends
// from. The control socket uses it to admit only this attempt's workers.
func (g *Group) RankOf(pid int) (int, error) {
	byPID := map[int]int{}
	for r, p := range g.PIDs() {
		byPID[p] = r
	}
	for p, hops := pid, 0; p > 1 && hops < 64; hops++ {
		if r, ok := byPID[p]; ok {
			return r, nil
		}
		st, err := readStat(p)
		if err != nil {
			return 0, fmt.Errorf("pid %d: %w", pid, err)
		}
		p = st.ppid
	}
	return 0, fmt.Errorf("pid %d is not a worker of this attempt or one of its children", pid)
}

type procStat struct {
	state byte // R, S, D, Z, T, ...
	ppid  int
}

// readStat reads /proc/<pid>/stat. The command name is in parentheses and
// may itself hold spaces and parentheses, so fields are counted after the
// last ')'.
func readStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 2 || len(f[0]) != 1 {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procStat{}, fmt.Errorf("malformed /proc/%d/stat: %w", pid, err)
	}
	return procStat{state: f[0][0], ppid: ppid}, nil
}

// procState describes a process's scheduler state for log lines.
func procState(pid int) string {
	st, err := readStat(pid)
	if err != nil {
		return "gone"
	}
	switch st.state {
	case 'D':
		return "D (uninterruptible sleep)"
	case 'Z':
		return "Z (zombie)"
	case 'T':
		return "T (stopped)"
	}
	return string(st.state)
}

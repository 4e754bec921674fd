package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// storeHost finds the launcher whose process (or a descendant) listens on
// port: the one that bound the rendezvous endpoint first (torchrun's c10d
// TCPStore) or hosts the embedded etcd (ddp-agent).
func storeHost(port int, nodes []*node) (*node, error) {
	inodes := listeningInodes(port)
	if len(inodes) == 0 {
		return nil, fmt.Errorf("nothing listens on rendezvous port %d (read /proc/net/tcp and tcp6)", port)
	}
	var hosts []*node
	for _, n := range nodes {
		pids := []int{n.pid}
		for _, p := range descendants(n.pid) {
			pids = append(pids, p.pid)
		}
		for _, pid := range pids {
			if ownsSocket(pid, inodes) {
				hosts = append(hosts, n)
				break
			}
		}
	}
	switch len(hosts) {
	case 1:
		return hosts[0], nil
	case 0:
		return nil, fmt.Errorf("port %d is listened on (socket inodes %v), but by none of the launchers or their children", port, keys(inodes))
	default:
		var idx []int
		for _, h := range hosts {
			idx = append(idx, h.idx)
		}
		return nil, fmt.Errorf("more than one launcher listens on rendezvous port %d: %v", port, idx)
	}
}

// listeningInodes returns the socket inodes in LISTEN state on port, IPv4 and IPv6.
func listeningInodes(port int) map[string]bool {
	out := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
			if len(fs) < 10 || fs[3] != "0A" || !strings.HasSuffix(fs[1], want) {
				continue
			}
			if fs[9] != "0" {
				out[fs[9]] = true
			}
		}
	}
	return out
}

func ownsSocket(pid int, inodes map[string]bool) bool {
	fdDir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return false
	}
	for _, e := range ents {
		l, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue
		}
		if ino, ok := strings.CutPrefix(l, "socket:["); ok && inodes[strings.TrimSuffix(ino, "]")] {
			return true
		}
	}
	return false
}

type proc struct{ pid, ppid, pgid int }

func procs() []proc {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(s[i+1:]) // state ppid pgrp ...
		if len(f) < 3 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgid, _ := strconv.Atoi(f[2])
		out = append(out, proc{pid, ppid, pgid})
	}
	return out
}

// descendants of pid (not pid itself), as of now.
func descendants(pid int) []proc {
	all := procs()
	children := map[int][]proc{}
	for _, p := range all {
		children[p.ppid] = append(children[p.ppid], p)
	}
	var out []proc
	queue := []int{pid}
	for len(queue) > 0 {
		q := queue[0]
		queue = queue[1:]
		for _, c := range children[q] {
			out = append(out, c)
			queue = append(queue, c.pid)
		}
	}
	return out
}

// killGroup signals process group pgid, never our own or init's.
func killGroup(pgid int, sig syscall.Signal) {
	if pgid <= 1 || pgid == syscall.Getpgrp() {
		return
	}
	_ = syscall.Kill(-pgid, sig)
}

func keys(m map[string]bool) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ddp-agent/ddp-agent/agent/rdzv/store"
)

// The etcd server runs in a child process: this program, re-executed with
// -serve.

// serverCounts is the line the child writes last: its warnings, counted.
type serverCounts struct {
	Counts   map[string]int    `json:"rdzvscale_counts"`
	Examples map[string]string `json:"examples"`
}

// serveStore is the child: it starts the embedded etcd (one member, or a
// cluster of members on loopback), prints its endpoints comma-joined on
// one line, and serves until its stdin closes (the parent is done or
// gone). etcd's warnings are counted and go to stderr once, as the
// serverCounts line, for the parent to count. The profiles are this whole
// process's: with several members, of them all together.
func serveStore(members int, cpuprof, lockprof string, verbose bool) error {
	if lockprof != "" {
		startLockProfiles()
		defer writeLockProfiles(lockprof)
	}
	// etcd's warnings are counted here and sent to the parent once, at the
	// end: under load etcd warns thousands of times a second ("apply
	// request took too long"), and a pipe to a busy parent would block
	// etcd's goroutines on the logger's lock, which is not what is measured.
	warns := newTally()
	var next slog.Handler
	if verbose {
		next = slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	log := slog.New(&countHandler{t: warns, who: "etcd server", next: next})
	defer func() {
		warns.mu.Lock()
		b, _ := json.Marshal(serverCounts{Counts: warns.m, Examples: warns.ex})
		warns.mu.Unlock()
		fmt.Fprintf(os.Stderr, "%s\n", b)
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var endpoints []string
	if members > 1 {
		c, err := store.StartCluster(ctx, members, log)
		if err != nil {
			return err
		}
		defer c.Close()
		endpoints = c.Endpoints()
	} else {
		srv, err := store.Start(ctx, store.ServerConfig{ClientAddr: "127.0.0.1:0", Logger: log})
		if err != nil {
			return err
		}
		defer srv.Close()
		endpoints = []string{srv.Endpoint()}
	}
	if cpuprof != "" {
		f, err := os.Create(cpuprof)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Println(strings.Join(endpoints, ","))
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

// server is the parent's handle on the etcd child.
type server struct {
	cmd       *exec.Cmd
	stdin     io.WriteCloser
	endpoints []string // every member's host:port, member 0 first
	logDone   chan struct{}
}

// endpoint names the store in the agents' messages: every member's
// host:port, comma-joined.
func (s *server) endpoint() string { return strings.Join(s.endpoints, ",") }

// startServer re-executes this program with -serve, of members etcd
// members, and waits for the endpoints it prints. etcd's warnings are
// tallied in warns.
func startServer(o options, members int, prof, lockprof string, warns *tally) (*server, error) {
	args := []string{"-serve", "-serve-members", strconv.Itoa(members)}
	if o.verbose {
		args = append(args, "-v")
	}
	if prof != "" {
		args = append(args, "-serve-cpuprofile", prof)
	}
	if lockprof != "" {
		args = append(args, "-serve-lockprofile", lockprof)
	}
	cmd := exec.Command(o.selfPath, args...)
	// The child dies with this process, however it ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &server{cmd: cmd, stdin: stdin, logDone: make(chan struct{})}
	go func() {
		defer close(s.logDone)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64*1024), 1024*1024)
		for sc.Scan() {
			line := sc.Text()
			var c serverCounts
			if json.Unmarshal([]byte(line), &c) == nil && c.Counts != nil {
				for msg, n := range c.Counts {
					warns.addN(msg, c.Examples[msg], n)
				}
				continue
			}
			if o.verbose {
				fmt.Fprintln(os.Stderr, "etcd:", line)
			} else {
				warns.add("etcd server: "+line, "") // not a log record: a crash, most likely
			}
		}
	}()
	got := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(stdout).ReadString('\n')
		got <- strings.TrimSpace(line)
		_, _ = io.Copy(io.Discard, stdout)
	}()
	select {
	case ep := <-got:
		if ep == "" {
			s.stop()
			return nil, errors.New("the etcd child exited before serving")
		}
		s.endpoints = strings.Split(ep, ",")
		return s, nil
	case <-time.After(45 * time.Second): // the child gives up starting after 30 s, and says why
		s.stop()
		return nil, errors.New("the etcd child did not serve within 45 s")
	}
}

// stop closes the child's stdin, which ends it (writing its profile), and
// kills it if it does not exit within 10 s.
func (s *server) stop() {
	s.stdin.Close()
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
	select {
	case <-s.logDone:
	case <-time.After(time.Second):
	}
}

// mem returns the child's current and peak RSS, in bytes.
func (s *server) mem() (rss, hwm uint64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseUint(f[1], 10, 64)
		switch f[0] {
		case "VmRSS:":
			rss = v * 1024
		case "VmHWM:":
			hwm = v * 1024
		}
	}
	return rss, hwm
}

// cpu returns the child's CPU time (user + system) so far.
func (s *server) cpu() time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", s.cmd.Process.Pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * (time.Second / 100) // USER_HZ is 100 on Linux
}

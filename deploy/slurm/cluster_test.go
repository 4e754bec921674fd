package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A cluster is a real Slurm on this host: munged, slurmctld and two slurmd
// (nodes n1 and n2, both at 127.0.0.1 on ports of their own, Debian's
// multiple-slurmd build), all configured and kept under one temporary
// directory.
type cluster struct {
	dir     string   // everything: slurm.conf, state, spool, logs, munge
	env     []string // the environment of Slurm's commands and daemons
	daemons []*exec.Cmd
}

// slurmTools are the commands the test runs; testdeps.sh installs them.
var slurmTools = []string{"munged", "munge", "slurmctld", "slurmd", "slurmstepd", "sbatch", "srun", "scontrol", "squeue", "scancel", "sinfo"}

// startCluster writes the configuration, starts the daemons and waits until
// both nodes are idle. Everything is stopped at the test's cleanup, even on
// failure: the jobs cancelled, the daemons stopped, and any process left
// that carries this cluster's SLURM_CONF killed.
func startCluster(ctx context.Context, t *testing.T, repo string) *cluster {
	t.Helper()
	dir := t.TempDir()
	// munged warns, and clients outside root cannot reach a socket, unless
	// every directory above it may be searched.
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"munge", "munge-key", "state", "spool/n1", "spool/n2", "log", "checks", "drain", "out"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "munge-key"), 0o700); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "slurm.conf")
	// The site's settings file (DDP_AGENT_SLURM_DEFAULTS, in place of
	// /etc/default/ddp-agent-slurm), read by the prolog, the epilog and the
	// jobs' sbatch scripts alike.
	c := &cluster{dir: dir, env: append(cleanEnv(), "SLURM_CONF="+conf, "DDP_AGENT_SLURM_DEFAULTS="+siteDefaults(dir))}
	t.Cleanup(c.stop)

	key := make([]byte, 1024)
	if f, err := os.Open("/dev/urandom"); err != nil {
		t.Fatal(err)
	} else {
		_, err = f.Read(key)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "munge-key/key"), key, 0o600); err != nil {
		t.Fatal(err)
	}
	c.writeHooks(t, repo)
	ports := []int{freePort(t), freePort(t), freePort(t)}
	if err := os.WriteFile(conf, []byte(slurmConf(dir, ports)), 0o644); err != nil {
		t.Fatal(err)
	}

	c.start(t, "munged", "munged", "-F", "--force", "--socket="+c.mungeSocket(),
		"--key-file="+filepath.Join(dir, "munge-key/key"), "--log-file="+filepath.Join(dir, "log/munged.log"),
		"--pid-file="+filepath.Join(dir, "munge/munged.pid"), "--seed-file="+filepath.Join(dir, "munge/seed"))
	waitFor(ctx, t, 10*time.Second, "munged's socket", func() (bool, string) {
		_, err := os.Stat(c.mungeSocket())
		return err == nil, fmt.Sprint(err)
	})
	c.start(t, "slurmctld", "slurmctld", "-D", "-i")
	c.start(t, "slurmd-n1", "slurmd", "-D", "-N", "n1")
	c.start(t, "slurmd-n2", "slurmd", "-D", "-N", "n2")
	waitFor(ctx, t, 40*time.Second, "sinfo to show n1 and n2 idle", func() (bool, string) {
		out, err := c.cmd(ctx, "sinfo", "-h", "-N", "-o", "%N %T")
		return err == nil && strings.Contains(out, "n1 idle") && strings.Contains(out, "n2 idle"), out + fmt.Sprint(err)
	})
	return c
}

func (c *cluster) mungeSocket() string { return filepath.Join(c.dir, "munge/munge.socket") }

// siteDefaults is the cluster's site settings file, as a site's
// /etc/default/ddp-agent-slurm.
func siteDefaults(dir string) string { return filepath.Join(dir, "ddp-agent-slurm") }

// slurmConf is the configuration: two nodes on this host told apart by name
// and port, process tracking through /proc (no cgroup setup needed in a
// container), no accounting database (job states from scontrol). As
// README.md asks of a site: nohold_on_prolog_fail, so that a job whose
// prolog failed on a node (a check exiting 3) runs on another instead of
// waiting held, and KillWait=30 (Slurm's default), 15 s over the agent's
// --stop-timeout. cred_expire=10 (120 by default) is also how long a
// requeued job waits before it may start again, and sched_interval=2 (60)
// how long it may wait then for the scheduler's next pass: seconds, not
// minutes, for the requeue test.
func slurmConf(dir string, ports []int) string {
	return fmt.Sprintf(`ClusterName=ddptest
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=%[1]s/munge/munge.socket,cred_expire=10
SlurmctldPort=%[2]d
StateSaveLocation=%[1]s/state
SlurmdSpoolDir=%[1]s/spool/%%n
SlurmctldPidFile=%[1]s/slurmctld.pid
SlurmdPidFile=%[1]s/slurmd-%%n.pid
SlurmctldLogFile=%[1]s/log/slurmctld.log
SlurmdLogFile=%[1]s/log/slurmd-%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SchedulerType=sched/builtin
SchedulerParameters=nohold_on_prolog_fail,sched_interval=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
Prolog=%[1]s/prolog
Epilog=%[1]s/epilog
PrologFlags=Alloc
KillWait=30
InactiveLimit=0
MinJobAge=600
SlurmdTimeout=60
NodeName=n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=%[3]d CPUs=2 State=UNKNOWN
NodeName=n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=%[4]d CPUs=2 State=UNKNOWN
PartitionName=debug Nodes=n1,n2 Default=YES MaxTime=10 State=UP
`, dir, ports[0], ports[1], ports[2])
}

// writeHooks installs the prolog and epilog as a site would, through small
// wrappers that point them at this cluster (slurmd gives them a bare
// environment), the site's settings file (the checks' directory and a drain
// directory that is not the default), and one health check that records
// each run.
func (c *cluster) writeHooks(t *testing.T, repo string) {
	t.Helper()
	defaults := fmt.Sprintf("# as /etc/default/ddp-agent-slurm\nDDP_AGENT_CHECKS_DIR=%s/checks\nDDP_AGENT_DRAIN_DIR=%[1]s/drain\n", c.dir)
	if err := os.WriteFile(siteDefaults(c.dir), []byte(defaults), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, hook := range []string{"prolog", "epilog"} {
		c.writeHook(t, hook, filepath.Join(repo, "deploy/slurm", hook+".sh"))
	}
	check := fmt.Sprintf("#!/bin/sh\necho \"$SLURM_SCRIPT_CONTEXT $SLURM_JOB_ID $SLURMD_NODENAME\" >>%s/checks.log\necho ok\n", c.dir)
	if err := os.WriteFile(filepath.Join(c.dir, "checks/10-record.sh"), []byte(check), 0o755); err != nil {
		t.Fatal(err)
	}
}

// writeHook points the cluster's Prolog or Epilog (hook) at script. slurmd
// runs the wrapper anew for every job: it is replaced whole (a rename), never
// rewritten in place under a shell that may be reading it.
func (c *cluster) writeHook(t *testing.T, hook, script string) {
	t.Helper()
	wrapper := fmt.Sprintf("#!/bin/sh\nexport SLURM_CONF=%s/slurm.conf DDP_AGENT_SLURM_DEFAULTS=%s\nexec %s\n", c.dir, siteDefaults(c.dir), script)
	path := filepath.Join(c.dir, hook)
	if err := os.WriteFile(path+".new", []byte(wrapper), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
}

// start runs a daemon in the foreground, in a process group of its own,
// its output in log/NAME.out.
func (c *cluster) start(t *testing.T, name, prog string, args ...string) {
	t.Helper()
	out, err := os.Create(filepath.Join(c.dir, "log", name+".out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command(prog, args...)
	cmd.Env = c.env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	c.daemons = append(c.daemons, cmd)
}

// stop cancels what is still queued or running, stops the daemons (the
// last started first), then kills whatever process is left with this
// cluster's configuration in its environment: job steps, their workers.
func (c *cluster) stop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := c.cmd(ctx, "squeue", "-h", "-o", "%i"); err == nil && strings.TrimSpace(out) != "" {
		args := append([]string{"--full"}, strings.Fields(out)...)
		_, _ = c.cmd(ctx, "scancel", args...)
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if out, err := c.cmd(ctx, "squeue", "-h", "-o", "%i"); err != nil || strings.TrimSpace(out) == "" {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	for i := len(c.daemons) - 1; i >= 0; i-- {
		cmd := c.daemons[i]
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	}
	for _, p := range processesWithEnv("SLURM_CONF=" + filepath.Join(c.dir, "slurm.conf")) {
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
	}
}

// cmd runs one of Slurm's commands against this cluster, for at most 30 s.
func (c *cluster) cmd(ctx context.Context, name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	if err != nil {
		err = fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), err
}

// sbatch submits a job with env (on top of the cluster's) and returns its
// id and the path of its output file.
func (c *cluster) sbatch(ctx context.Context, t *testing.T, env []string, args ...string) (id, output string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	args = append([]string{"--parsable", "--output=" + filepath.Join(c.dir, "out", "%j.out")}, args...)
	cmd := exec.CommandContext(ctx, "sbatch", args...)
	cmd.Env = append(append([]string{}, c.env...), env...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sbatch %s: %v: %s", strings.Join(args, " "), err, out)
	}
	id = strings.TrimSpace(strings.Split(string(out), ";")[0])
	return id, filepath.Join(c.dir, "out", id+".out")
}

var (
	jobStateRE = regexp.MustCompile(`JobState=(\S+)`)
	exitCodeRE = regexp.MustCompile(`\bExitCode=(\S+)`)
)

// job returns a job's state and exit code ("0:0": code, signal) as
// `scontrol show job` has them (there is no accounting database).
func (c *cluster) job(ctx context.Context, id string) (state, exit string, err error) {
	out, err := c.cmd(ctx, "scontrol", "show", "job", id)
	if err != nil {
		return "", "", err
	}
	if m := jobStateRE.FindStringSubmatch(out); m != nil {
		state = m[1]
	}
	if m := exitCodeRE.FindStringSubmatch(out); m != nil {
		exit = m[1]
	}
	return state, exit, nil
}

// waitJob waits until the job has ended and returns its state and exit code.
func (c *cluster) waitJob(ctx context.Context, t *testing.T, id string, timeout time.Duration) (state, exit string) {
	t.Helper()
	waitFor(ctx, t, timeout, "job "+id+" to end", func() (bool, string) {
		var err error
		state, exit, err = c.job(ctx, id)
		switch state {
		case "", "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED":
			return false, fmt.Sprintf("state %q %v", state, err)
		}
		return true, ""
	})
	return state, exit
}

// logs is the tail of the daemons' logs, for a failure's message.
func (c *cluster) logs() string {
	var b strings.Builder
	for _, name := range []string{"slurmctld.log", "slurmd-n1.log", "slurmd-n2.log", "munged.out", "slurmctld.out"} {
		data, err := os.ReadFile(filepath.Join(c.dir, "log", name))
		if err != nil {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(data)), "\n")
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		fmt.Fprintf(&b, "--- %s\n%s\n", name, strings.Join(lines, "\n"))
	}
	return b.String()
}

// A proc is a process found in /proc.
type proc struct {
	pid  int
	argv []string
}

// processesWithEnv lists the processes (other than this one) whose
// environment holds the entry kv ("KEY=value") or whose command line
// contains kv.
func processesWithEnv(kv string) []proc {
	entries, _ := os.ReadDir("/proc")
	var found []proc
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil || len(cmdline) == 0 { // gone, or a zombie or kernel thread
			continue
		}
		env, _ := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		hit := bytes.Contains(cmdline, []byte(kv))
		for _, entry := range bytes.Split(env, []byte{0}) {
			hit = hit || string(entry) == kv
		}
		if hit {
			found = append(found, proc{pid, strings.Split(strings.TrimSuffix(string(cmdline), "\x00"), "\x00")})
		}
	}
	return found
}

// cleanEnv is this process's environment less what would leak into the
// jobs from an outer launcher or cluster.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "SLURM_") || strings.HasPrefix(k, "DDP_AGENT_") || strings.HasPrefix(k, "PET_") ||
			strings.HasPrefix(k, "TORCHELASTIC_") || strings.HasPrefix(k, "OTEL_") ||
			k == "MASTER_ADDR" || k == "MASTER_PORT" || k == "RANK" || k == "WORLD_SIZE" || k == "LOCAL_RANK" {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// freePort returns a TCP port that was free on 127.0.0.1 a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitFor polls cond every 250 ms until it holds, failing the test after
// timeout with cond's last word.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		ok, last := cond()
		if ok {
			return
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				t.Fatalf("waited %v for %s; last: %s", timeout, what, strings.TrimSpace(last))
			}
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

package launch

import (
	"errors"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

func noEnv(string) string { return "" }

var fourCPUs = Host{CPUs: 4, GPUs: func() (int, error) { return 0, errors.New("no driver") }}

// torchrunLine is a torchrun command line and what it must mean: the worker
// command, and a check that returns what it wanted when the Config is wrong.
type torchrunLine struct {
	name    string
	args    string
	check   func(*Config) string
	command []string
}

// torchrunLines are command lines from torchrun's documentation and habits.
var torchrunLines = []torchrunLine{
	{
		name:    "docs single node",
		args:    "--standalone --nnodes=1 --nproc-per-node=2 train.py --arg1 x",
		command: []string{"python3", "-u", "train.py", "--arg1", "x"},
		check: func(c *Config) string {
			if !c.Standalone || c.NProcPerNode != 2 || c.NNodesMin != 1 || c.NNodesMax != 1 {
				return "standalone 2 procs 1 node"
			}
			return ""
		},
	},
	{
		name:    "underscore spellings",
		args:    "--nnodes 1 --nproc_per_node 3 --max_restarts 2 --node_rank 0 --master_addr 10.0.0.1 --master_port 29500 train.py",
		command: []string{"python3", "-u", "train.py"},
		check: func(c *Config) string {
			if c.NProcPerNode != 3 || c.MaxRestarts != 2 || c.MasterAddr != "10.0.0.1" || c.MasterPort != 29500 {
				return "3 procs, 2 restarts, master 10.0.0.1:29500"
			}
			return ""
		},
	},
	{
		name:    "static multi-node",
		args:    "--nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 10.0.0.1 train.py",
		command: []string{"python3", "-u", "train.py"},
		check: func(c *Config) string {
			if c.Dynamic() || c.MasterPort != 29500 || c.RdzvID != "none" {
				return "static, master port 29500, run id none on every node as torchrun's"
			}
			return ""
		},
	},
	{
		name:    "module",
		args:    "--nproc-per-node=4 -m pkg.train --epochs 3",
		command: []string{"python3", "-u", "-m", "pkg.train", "--epochs", "3"},
	},
	{
		name:    "no python",
		args:    "--no-python --nproc-per-node 2 ./run.sh a b",
		command: []string{"./run.sh", "a", "b"},
	},
	{
		name:    "script flags are the script's",
		args:    "--nproc-per-node 1 train.py --nproc-per-node 5 --bogus",
		command: []string{"python3", "-u", "train.py", "--nproc-per-node", "5", "--bogus"},
	},
	{
		name:    "double dash",
		args:    "--nproc-per-node 1 -- -weird-name.py x",
		command: []string{"python3", "-u", "./-weird-name.py", "x"}, // not Python's option -w
	},
	{
		name: "rendezvous flags",
		args: "--nnodes=1:1 --rdzv-backend=c10d --rdzv-endpoint=localhost:29400 --rdzv-id=job7 --rdzv-conf=timeout=60 train.py",
		check: func(c *Config) string {
			if c.RdzvBackend != "c10d" || c.RdzvEndpoint != "localhost:29400" || c.RdzvID != "job7" || c.RdzvConf != "timeout=60" {
				return "c10d localhost:29400 job7"
			}
			if c.Rdzv.JoinTimeout != time.Minute || !c.Dynamic() {
				return "timeout=60 as the join timeout, a dynamic rendezvous"
			}
			return ""
		},
	},
	{
		name: "elastic job",
		args: "--nnodes 2:4 --rdzv-backend c10d --rdzv-endpoint node0 --rdzv-conf join_timeout=30,last_call_timeout=0.5,keep_alive_interval=2,keep_alive_max_attempt=4,is_host=false,store_quota=512MiB train.py",
		check: func(c *Config) string {
			r := c.Rdzv
			if c.NNodesMin != 2 || c.NNodesMax != 4 || !c.Dynamic() || c.ExternalStore() || c.RdzvID != "none" {
				return "nnodes 2:4, dynamic, hosted store, run id none"
			}
			if r.JoinTimeout != 30*time.Second || r.LastCall != 500*time.Millisecond || r.TTL() != 8*time.Second || r.IsHost == nil || *r.IsHost {
				return "join 30s, last call 0.5s, TTL 8s, is_host false"
			}
			if r.StoreQuota != 512<<20 {
				return "store quota 512 MiB"
			}
			if eps := c.Endpoints(); len(eps) != 1 || eps[0] != "node0:29400" {
				return "endpoint node0:29400"
			}
			return ""
		},
	},
	{
		name: "etcd cluster",
		args: "--nnodes 3 --rdzv-backend etcd --rdzv-endpoint 10.0.0.1,10.0.0.2:2381,https://e3:2379 --rdzv-token s3cret-s3cret-s3cret train.py",
		check: func(c *Config) string {
			eps := c.Endpoints()
			if !c.ExternalStore() || len(eps) != 3 || eps[0] != "10.0.0.1:2379" || eps[1] != "10.0.0.2:2381" || eps[2] != "https://e3:2379" || c.RdzvToken != "s3cret-s3cret-s3cret" {
				return "three etcd endpoints with default ports, the token"
			}
			return ""
		},
	},
	{
		name: "static multi-node",
		args: "--nnodes 2 --node-rank 1 --master-addr 10.0.0.1 train.py",
		check: func(c *Config) string {
			if c.Dynamic() || c.NodeRank != 1 || c.MasterPort != 29500 {
				return "static, node rank 1, master port 29500 as torchrun"
			}
			return ""
		},
	},
	{
		name: "logs",
		args: "--log-dir /tmp/logs -r 3 -t 0:1,1:2 --role trainer --run-id r1 train.py",
		check: func(c *Config) string {
			if c.LogDir != "/tmp/logs" || c.Redirects.For(0) != StdAll || c.Tee.For(0) != StdOut || c.Tee.For(1) != StdErr || c.Tee.For(2) != StdNone || c.Role != "trainer" || c.RdzvID != "r1" {
				return "log dir, redirects 3, tee per rank, role, run id"
			}
			return ""
		},
	},
	{
		name: "numa binding",
		args: "--numa_binding exclusive train.py",
		check: func(c *Config) string {
			if c.NUMABinding != "exclusive" {
				return "numa binding exclusive"
			}
			return ""
		},
	},
	{
		name: "durations",
		args: "--monitor-interval 0.5 --stop-timeout 3 train.py",
		check: func(c *Config) string {
			if c.MonitorInterval != 500*time.Millisecond || c.StopTimeout != 3*time.Second {
				return "monitor 500ms, stop 3s"
			}
			return ""
		},
	},
	{
		name: "nproc cpu and auto without GPUs",
		args: "--nproc-per-node auto train.py",
		check: func(c *Config) string {
			if c.NProcPerNode != 4 {
				return "4 workers (one per CPU)"
			}
			return ""
		},
	},
	{
		name: "argparse habits: last wins, prefixes, attached short values",
		args: "--nproc 1 --nproc_per_node=3 -r3 -t0:1 --max_r 2 --run_path train.py",
		check: func(c *Config) string {
			if c.NProcPerNode != 3 || c.Redirects.All != StdAll || c.Tee.For(0) != StdOut || c.MaxRestarts != 2 {
				return "3 procs (last wins), redirects 3, tee 0:1, 2 restarts"
			}
			return ""
		},
	},
	{
		name:    "warm spares",
		args:    "--spares 2 train.py --lr 0.1",
		command: []string{"python3", "-u", "train.py", "--lr", "0.1"},
		check: func(c *Config) string {
			want := []string{"python3", "-u", "-m", "ddp_agent._spare", "train.py", "--lr", "0.1"}
			if c.Spares != 2 || !reflect.DeepEqual(c.SpareCommand(), want) {
				return "2 spares running python3 -u -m ddp_agent._spare train.py --lr 0.1"
			}
			if got := c.StoreCommand(); !reflect.DeepEqual(got, []string{"python3", "-u", "-m", "ddp_agent._store"}) {
				return "the workers' store served by python3 -u -m ddp_agent._store"
			}
			c.Module = true
			if got := c.SpareCommand(); !reflect.DeepEqual(got[:6], []string{"python3", "-u", "-m", "ddp_agent._spare", "-m", "train.py"}) {
				return "a module's spare: -m ddp_agent._spare -m MODULE"
			}
			return ""
		},
	},
	{
		name: "defaults",
		args: "train.py",
		check: func(c *Config) string {
			want := &Config{NProcPerNode: 1, NProcSpec: "1", NProcLimit: 32, NNodesMin: 1, NNodesMax: 1, RdzvBackend: "static",
				MonitorInterval: 5 * time.Second, StopTimeout: 10 * time.Second, StartMethod: "spawn", Role: "default",
				Python: "python3", LogLevel: "info", HangTimeout: time.Minute, TraceSample: 0.1, StragglerCost: 0.05,
				StragglerAction: "log", StragglerConfirm: time.Minute, MetricsLinger: time.Minute, Script: "train.py", Rdzv: DefaultRdzvConf,
				Signals: []syscall.Signal{syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT}}
			if !reflect.DeepEqual(c, want) {
				return "the documented defaults"
			}
			return ""
		},
	},
}

// TestParseTorchrunLines checks that command lines from torchrun's
// documentation mean the same thing to ddp-agent.
func TestParseTorchrunLines(t *testing.T) {
	for _, tc := range torchrunLines {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(strings.Fields(tc.args), noEnv, fourCPUs)
			if err != nil {
				t.Fatalf("Parse(%q): %v", tc.args, err)
			}
			if tc.command != nil && !reflect.DeepEqual(c.Command(), tc.command) {
				t.Errorf("command: got %q, want %q", c.Command(), tc.command)
			}
			if tc.check != nil {
				if want := tc.check(c); want != "" {
					t.Errorf("got %+v, want %s", c, want)
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, args, want string
	}{
		{"unknown flag", "--nprocs 2 train.py", "unknown flag --nprocs"},
		{"module and no-python", "-m --no-python pkg", "contradict"},
		{"spares without python", "--spares 1 --no-python ./train", "--spares needs a Python script"},
		{"negative spares", "--spares -1 train.py", "--spares must be an integer >= 0"},
		{"zero procs", "--nproc-per-node 0 train.py", "--nproc-per-node must be"},
		{"bad procs", "--nproc-per-node lots train.py", "--nproc-per-node must be"},
		{"gpu without GPUs", "--nproc-per-node gpu train.py", "no GPU found"},
		{"elastic without a store", "--nnodes 1:2 train.py", "needs a rendezvous store"},
		{"c10d without endpoint", "--nnodes 2 --rdzv-backend c10d train.py", "needs --rdzv-endpoint"},
		{"node rank with c10d", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:1 --node-rank 1 train.py", "--node-rank is for the static"},
		{"c10d with a list", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:1,g:1 train.py", "takes one endpoint"},
		{"standalone on two nodes", "--standalone --nnodes 2 train.py", "--standalone is for one node"},
		{"standalone with a node rank", "--standalone --node-rank 1 train.py", "--node-rank 1: --standalone is one node"},
		{"endpoint not host:port", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint bad::endpoint:: train.py", "is neither a host name nor an IP address"},
		{"endpoint port out of range", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:99999 train.py", "must be 1..65535"},
		{"endpoint port 0 for two nodes", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:0 train.py", "port 0 picks a free port"},
		{"endpoint without a host", "--nnodes 2 --rdzv-backend c10d --rdzv-endpoint :29400 train.py", "names no host"},
		{"etcd on port 0", "--rdzv-backend etcd --rdzv-endpoint e1:0 train.py", "port 0 picks a free port"},
		{"etcd URL without a host", "--nnodes 2 --rdzv-backend etcd --rdzv-endpoint http:// train.py", "not a URL with a host"},
		{"static endpoint without a port", "--nnodes 2 --rdzv-backend static --rdzv-endpoint h train.py", "want the master's HOST:PORT"},
		{"static endpoint and master differ", "--nnodes 2 --rdzv-backend static --rdzv-endpoint h:1 --master-addr g train.py", "name different masters"},
		{"rdzv conf unknown key", "--rdzv-conf jion_timeout=5 train.py", "unknown key \"jion_timeout\""},
		{"rdzv conf bad value", "--rdzv-conf join_timeout=soon train.py", "join_timeout"},
		{"rdzv conf short ttl", "--rdzv-conf keep_alive_interval=0.5,keep_alive_max_attempt=2 train.py", "at least 2s"},
		{"unknown signal", "--signals-to-handle SIGTERM,SIGKILL train.py", "\"SIGKILL\" is not one of"},
		{"short token", "--rdzv-token hunter2 train.py", "7 characters can be guessed offline"},
		{"rdzv conf tiny store", "--rdzv-conf store_quota=1MiB train.py", "from 4MiB to 8GiB"},
		{"rdzv conf store quota not a size", "--rdzv-conf store_quota=lots train.py", "store_quota"},
		{"rdzv conf cert without key", "--rdzv-conf cert=/c.pem train.py", "cert and key"},
		{"bad range", "--nnodes 3:1 train.py", "MIN:MAX"},
		{"node rank past nnodes", "--node-rank 1 train.py", "--node-rank 1 must be below"},
		{"redirects out of range", "--redirects 4 train.py", "--redirects"},
		{"tee malformed", "--tee 0=1 train.py", "--tee"},
		{"missing script", "--nproc-per-node 2", "missing the training script"},
		{"a flag took the script", "--standalone --nproc-per-node train.py", "missing the training script: --nproc-per-node took train.py as its value"},
		{"missing value", "--nproc-per-node", "needs a value"},
		{"metrics port out of range", "--metrics-addr :99999 train.py", "--metrics-addr \":99999\": the port must be a number from 0 to 65535, or a service name"},
		{"metrics addr without a port", "--metrics-addr localhost train.py", "is not host:port"},
		{"ambiguous prefix", "--m 1 train.py", "ambiguous flag --m could be"},
		{"bad PET bool", "train.py", "not a boolean"},
		{"standalone with port", "--standalone --master-port 29500 train.py", "--standalone picks"},
		{"run id conflict", "--run-id a --rdzv-id b train.py", "differ"},
		{"run id a path", "--standalone --rdzv-id ../x train.py", "--rdzv-id: rendezvous id \"../x\": use 1-128 letters"},
		{"run id a path, static", "--nnodes 2 --master-addr h --rdzv-id a/b train.py", "--rdzv-id: rendezvous id"},
		{"negative restarts", "--max-restarts -1 train.py", "--max-restarts must be"},
		{"bad port", "--master-port 70000 train.py", "--master-port"},
		{"bad duration", "--stop-timeout soon train.py", "--stop-timeout"},
		{"bool with value", "--standalone=true train.py", "takes no value"},
		{"bad backend", "--rdzv-backend zk train.py", "--rdzv-backend"},
		{"bad log level", "--log-level loud train.py", "--log-level"},
		{"bad numa binding", "--numa-binding socket train.py", "--numa-binding \"socket\" is not one of none, node, exclusive"},
		{"hang timeout below a second", "--hang-timeout 200ms train.py", "--hang-timeout 200ms is below a second"},
		{"bad hang timeout", "--hang-timeout soon train.py", "--hang-timeout must be a duration (seconds, or like 500ms), got \"soon\""},
		{"trace sample above 1", "--trace-sample 1.5 train.py", "--trace-sample must be a number from 0 to 1"},
		{"trace sample not a number", "--trace-sample all train.py", "--trace-sample must be a number from 0 to 1"},
		{"straggler cost 0", "--straggler-cost 0 train.py", "--straggler-cost must be a share of step time between 0 and 1"},
		{"straggler cost not a number", "--straggler-cost x train.py", "--straggler-cost must be a share of step time"},
		{"bad straggler action", "--straggler-action reboot train.py", "--straggler-action \"reboot\" is not one of log, restart, drain"},
		{"straggler confirm 0", "--straggler-confirm 0 train.py", "--straggler-confirm must be a duration above 0 (seconds, or like 90s), got \"0\""},
		{"straggler confirm not a duration", "--straggler-confirm soon train.py", "--straggler-confirm must be a duration above 0"},
		{"straggler prefix now ambiguous", "--straggler-c 0.1 train.py", "ambiguous flag --straggler-c"},
		{"otel endpoint without a port", "--otel-endpoint nohostport train.py", "--otel-endpoint \"nohostport\": address nohostport: missing port in address"},
		{"otel endpoint scheme", "--otel-endpoint ftp://x:1 train.py", "--otel-endpoint \"ftp://x:1\": scheme \"ftp\""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			getenv := noEnv
			if tc.name == "bad PET bool" {
				getenv = func(k string) string {
					if k == "PET_STANDALONE" {
						return "yes please"
					}
					return ""
				}
			}
			_, err := Parse(strings.Fields(tc.args), getenv, fourCPUs)
			var uerr *UsageError
			if !errors.As(err, &uerr) {
				t.Fatalf("Parse(%q): got %v, want a *UsageError", tc.args, err)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "\n") {
				t.Errorf("got %q, want one line containing %q", err, tc.want)
			}
		})
	}
}

// TestParseOTelVariables: the OTEL_* variables the exporters read are
// checked with the command line, a usage error (exit 2) before anything
// starts; a wrong one once failed the job at run time (exit 1), with a
// job_failed sent to the notifiers.
func TestParseOTelVariables(t *testing.T) {
	for name, value := range map[string]string{"OTEL_TRACES_EXPORTER": "jaeger", "OTEL_EXPORTER_OTLP_PROTOCOL": "thrift"} {
		t.Run(name, func(t *testing.T) {
			t.Setenv(name, value)
			_, err := Parse([]string{"train.py"}, noEnv, fourCPUs)
			var uerr *UsageError
			if !errors.As(err, &uerr) || !strings.Contains(err.Error(), value) {
				t.Errorf("%s=%s: got %v, want a usage error naming it", name, value, err)
			}
		})
	}
}

func TestParseHelp(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"--nproc-per-node", "2", "--help"}} {
		if _, err := Parse(args, noEnv, fourCPUs); !errors.Is(err, ErrHelp) {
			t.Errorf("Parse(%q): got %v, want ErrHelp", args, err)
		}
	}
	u := Usage()
	for _, f := range flagSpecs {
		if !strings.Contains(u, "--"+f.name) {
			t.Errorf("usage does not mention --%s", f.name)
		}
	}
}

func TestParseEnvironment(t *testing.T) {
	env := map[string]string{"PET_NPROC_PER_NODE": "3", "PET_MAX_RESTARTS": "2", "DDP_AGENT_PYTHON": "/usr/bin/python3"}
	getenv := func(k string) string { return env[k] }
	c, err := Parse([]string{"--max-restarts", "5", "train.py"}, getenv, fourCPUs)
	if err != nil {
		t.Fatal(err)
	}
	if c.NProcPerNode != 3 || c.MaxRestarts != 5 || c.Python != "/usr/bin/python3" {
		t.Errorf("got nproc %d, restarts %d, python %q; want 3 (PET_), 5 (flag beats PET_), /usr/bin/python3", c.NProcPerNode, c.MaxRestarts, c.Python)
	}
	if _, err := Parse([]string{"train.py"}, func(k string) string {
		if k == "PET_NPROC_PER_NODE" {
			return "zero"
		}
		return ""
	}, fourCPUs); err == nil {
		t.Error("a bad PET_NPROC_PER_NODE was accepted")
	}
}

// TestParsePETNodeRank: Kubeflow Trainer sets PET_NODE_RANK on every pod;
// torchrun reads it for the static backend only, so it must not refuse a
// c10d or etcd command line there, as --node-rank given by hand does.
func TestParsePETNodeRank(t *testing.T) {
	kubeflow := map[string]string{"PET_NNODES": "4", "PET_NODE_RANK": "2", "PET_MASTER_ADDR": "job-node-0-0.job", "PET_MASTER_PORT": "29500"}
	getenv := func(k string) string { return kubeflow[k] }
	c, err := Parse(strings.Fields("--nnodes 3:4 --rdzv-backend c10d --rdzv-endpoint job-node-0-0.job:29400 train.py"), getenv, fourCPUs)
	if err != nil || c.NodeRank != 0 {
		t.Errorf("c10d under PET_NODE_RANK=2: got %v, %v; want accepted, node rank 0 (the store's to assign)", c, err)
	}
	// Nor does PET_MASTER_PORT pin the workers' store under c10d or etcd,
	// as torchrun ignores it there: each attempt picks a free port.
	for _, backend := range []string{"c10d", "etcd"} {
		args := "--nnodes 3:4 --rdzv-backend " + backend + " --rdzv-endpoint job-node-0-0.job:29400 train.py"
		c, err = Parse(strings.Fields(args), getenv, fourCPUs)
		if err != nil || c.MasterPort != 0 || c.MasterAddr != "" {
			t.Errorf("%s under PET_MASTER_*: got master %q:%d, %v; want neither taken", backend, c.MasterAddr, c.MasterPort, err)
		}
	}
	kubeflow["PET_RDZV_BACKEND"] = "c10d"
	c, err = Parse(strings.Fields("--nnodes 3:4 --rdzv-endpoint job-node-0-0.job:29400 train.py"), getenv, fourCPUs)
	if err != nil || c.MasterPort != 0 {
		t.Errorf("PET_RDZV_BACKEND=c10d under PET_MASTER_PORT: got master port %d, %v; want it not taken", c.MasterPort, err)
	}
	delete(kubeflow, "PET_RDZV_BACKEND")
	c, err = Parse([]string{"train.py"}, getenv, fourCPUs)
	if err != nil || c.NodeRank != 2 || c.NNodesMax != 4 || c.MasterPort != 29500 {
		t.Errorf("static under PET_*: got %+v, %v; want node rank 2 of 4, master port 29500", c, err)
	}
	if _, err := Parse(strings.Fields("--rdzv-backend c10d --rdzv-endpoint h:1 --node-rank 1 train.py"), getenv, fourCPUs); err == nil {
		t.Error("--node-rank on the command line with c10d was accepted")
	}
}

// TestParseStandaloneIgnoresPETNodeRank: a PET_NODE_RANK left in the
// environment does not make --standalone's only worker rank 1 of 1, which
// waited forever in init_process_group; torchrun ignores it too.
func TestParseStandaloneIgnoresPETNodeRank(t *testing.T) {
	getenv := func(k string) string { return map[string]string{"PET_NODE_RANK": "1"}[k] }
	c, err := Parse(strings.Fields("--standalone --nproc-per-node 2 train.py"), getenv, fourCPUs)
	if err != nil || c.NodeRank != 0 {
		t.Fatalf("--standalone under PET_NODE_RANK=1: got %+v, %v; want node rank 0", c, err)
	}
	// Kubeflow Trainer sets PET_MASTER_ADDR and PET_MASTER_PORT on every
	// pod too: under --standalone (or PET_STANDALONE) they are ignored, as
	// torchrun does; the flags themselves are still refused.
	kubeflow := map[string]string{"PET_NODE_RANK": "1", "PET_MASTER_ADDR": "job-0", "PET_MASTER_PORT": "23456"}
	for _, tc := range []struct {
		args string
		env  map[string]string
	}{
		{"--standalone train.py", kubeflow},
		{"train.py", map[string]string{"PET_STANDALONE": "1", "PET_MASTER_ADDR": "job-0", "PET_MASTER_PORT": "23456"}},
	} {
		c, err := Parse(strings.Fields(tc.args), func(k string) string { return tc.env[k] }, fourCPUs)
		if err != nil || c.MasterAddr != "" || c.MasterPort != 0 || c.NodeRank != 0 {
			t.Errorf("%s under %v: got %+v, %v; want accepted, no master, node rank 0", tc.args, tc.env, c, err)
		}
	}
	if _, err := Parse(strings.Fields("--standalone --master-port 23456 train.py"), getenv, fourCPUs); err == nil {
		t.Error("--standalone --master-port on the command line was accepted")
	}
}

// TestParseStaticEndpoint: under the static backend --rdzv-endpoint is
// the workers' master, as in torchrun; --master-addr and --master-port
// may say the same.
func TestParseStaticEndpoint(t *testing.T) {
	for _, args := range []string{
		"--nnodes 2 --node-rank 1 --rdzv-backend static --rdzv-endpoint 10.1.2.3:29530 train.py",
		"--nnodes 2 --node-rank 1 --rdzv-backend static --rdzv-endpoint 10.1.2.3:29530 --master-addr 10.1.2.3 --master-port 29530 train.py",
	} {
		c, err := Parse(strings.Fields(args), noEnv, fourCPUs)
		if err != nil || c.MasterAddr != "10.1.2.3" || c.MasterPort != 29530 || c.Dynamic() {
			t.Errorf("%s: got %+v, %v; want master 10.1.2.3:29530, static", args, c, err)
		}
	}
	c, err := Parse(strings.Fields("--rdzv-backend c10d --rdzv-endpoint localhost:0 train.py"), noEnv, fourCPUs)
	if err != nil || !c.Dynamic() {
		t.Errorf("c10d on port 0 for one node: got %+v, %v; want accepted", c, err)
	}
	for _, ep := range []string{"[::1]:29400", "[fe80::1%eth0]:29400", "node-0.job:29400"} {
		if _, err := Parse(strings.Fields("--nnodes 2 --rdzv-backend c10d --rdzv-endpoint "+ep+" train.py"), noEnv, fourCPUs); err != nil {
			t.Errorf("c10d at %s: %v, want accepted", ep, err)
		}
	}
}

func TestNProcGPU(t *testing.T) {
	eight := Host{CPUs: 2, GPUs: func() (int, error) { return 8, nil }}
	for _, spec := range []string{"gpu", "auto"} {
		c, err := Parse([]string{"--nproc-per-node", spec, "train.py"}, noEnv, eight)
		if err != nil || c.NProcPerNode != 8 {
			t.Errorf("--nproc-per-node %s: got %v, %v; want 8", spec, c, err)
		}
	}
	c, err := Parse([]string{"--nproc-per-node", "cpu", "train.py"}, noEnv, eight)
	if err != nil || c.NProcPerNode != 2 {
		t.Errorf("--nproc-per-node cpu: got %v, %v; want 2", c, err)
	}
}

func TestParseEnvironmentCompat(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	c, err := Parse([]string{"train.py"}, env(map[string]string{"PYTHON_EXEC": "/opt/venv/bin/python"}), fourCPUs)
	if err != nil || c.Python != "/opt/venv/bin/python" {
		t.Errorf("PYTHON_EXEC: got %v, %v; want /opt/venv/bin/python", c, err)
	}
	c, err = Parse([]string{"train.py"}, env(map[string]string{"PYTHON_EXEC": "/opt/venv/bin/python", "DDP_AGENT_PYTHON": "/usr/bin/python3"}), fourCPUs)
	if err != nil || c.Python != "/usr/bin/python3" {
		t.Errorf("DDP_AGENT_PYTHON over PYTHON_EXEC: got %v, %v", c, err)
	}
	c, err = Parse([]string{"train.py"}, env(map[string]string{"PET_STANDALONE": "1"}), fourCPUs)
	if err != nil || !c.Standalone {
		t.Errorf("PET_STANDALONE=1: got %v, %v; want standalone", c, err)
	}
	// PET_MASTER_PORT (Kubeflow sets it on every pod) is ignored under
	// --standalone, as torchrun does; --master-port itself is refused
	// (TestParseErrors).
	if c, err := Parse([]string{"--standalone", "train.py"}, env(map[string]string{"PET_MASTER_PORT": "29500"}), fourCPUs); err != nil || c.MasterPort != 0 {
		t.Errorf("--standalone with PET_MASTER_PORT: got %+v, %v; want it ignored", c, err)
	}
}

// TestParseStragglerAction: --straggler-action and --straggler-confirm,
// in either spelling, the window in seconds or as a Go duration.
func TestParseStragglerAction(t *testing.T) {
	tests := []struct {
		args    string
		action  string
		confirm time.Duration
	}{
		{"train.py", "log", time.Minute},
		{"--straggler-action restart --straggler-confirm 3s train.py", "restart", 3 * time.Second},
		{"--straggler_action=drain --straggler_confirm 90 train.py", "drain", 90 * time.Second},
		{"--straggler-confirm 1.5 train.py", "log", 1500 * time.Millisecond},
	}
	for _, tc := range tests {
		c, err := Parse(strings.Fields(tc.args), noEnv, fourCPUs)
		if err != nil {
			t.Fatalf("Parse(%q): %v", tc.args, err)
		}
		if c.StragglerAction != tc.action || c.StragglerConfirm != tc.confirm {
			t.Errorf("Parse(%q): action %q, confirm %v; want %q, %v", tc.args, c.StragglerAction, c.StragglerConfirm, tc.action, tc.confirm)
		}
	}
}

// TestSignalsToHandleNamed: the signals parsed from --signals-to-handle
// are named back, in their order, for the workers' environment.
func TestSignalsToHandleNamed(t *testing.T) {
	c := Config{Signals: []syscall.Signal{syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGINT}}
	if got, want := c.SignalsToHandle(), "SIGTERM,SIGUSR1,SIGINT"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

package launch

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
)

// TestSameMeaningAsTorchrun parses command lines with torchrun's own
// argparse parser (PyTorch 1.13 knows only the underscore spellings) and
// checks that ddp-agent reads every one the same way.
func TestSameMeaningAsTorchrun(t *testing.T) {
	python := os.Getenv("DDP_AGENT_PYTHON")
	if python == "" {
		python = "/usr/bin/python3"
	}
	if exec.Command(python, "-c", "import torch.distributed.run").Run() != nil {
		if os.Getenv("DDP_AGENT_REQUIRE_TORCH") == "1" {
			t.Fatalf("%s cannot import torch.distributed.run", python)
		}
		t.Skipf("%s cannot import torch.distributed.run", python)
	}
	lines := []string{
		"--standalone --nnodes=1 --nproc_per_node=4 train.py --lr 0.1 --epochs 3",
		"--nnodes 1 --nproc_per_node 2 --max_restarts 3 --role trainer train.py",
		"--nproc_per_node=8 -m pkg.train --config a.yaml",
		"--no_python --nproc_per_node 2 ./run.sh x y",
		"--nnodes=1:1 --rdzv_backend=c10d --rdzv_endpoint=localhost:29400 --rdzv_id=job7 train.py",
		"--master_addr 10.1.2.3 --master_port 29501 --node_rank 0 train.py",
		"--log_dir /tmp/logs -r 3 -t 0:1,1:2 train.py",
		"-r3 -t1 train.py",
		"--monitor_interval 0.5 --max_restarts 1 --max_restarts 2 train.py",
		"--nproc 3 --max_r 1 train.py",
		"train.py --nproc_per_node 5 --unknown-to-torchrun",
		"--nproc_per_node 2 -- train.py -x",
	}
	var argvs [][]string
	for _, l := range lines {
		argvs = append(argvs, strings.Fields(l))
	}
	in, _ := json.Marshal(argvs)
	cmd := exec.Command(python, "testdata/torchrun_parse.py")
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("torchrun's parser: %v\n%s", err, stderr.String())
	}
	var want []map[string]any
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatal(err)
	}
	for i, l := range lines {
		t.Run(l, func(t *testing.T) {
			c, err := Parse(argvs[i], noEnv, fourCPUs)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			w := want[i]
			nnodes := w["nnodes"].(string)
			if !strings.Contains(nnodes, ":") {
				nnodes += ":" + nnodes
			}
			scriptArgs := []string{}
			for _, a := range w["script_args"].([]any) {
				scriptArgs = append(scriptArgs, a.(string))
			}
			got := map[string]any{
				"nproc_per_node": c.NProcSpec, "nnodes": nnodes, "node_rank": c.NodeRank, "standalone": c.Standalone,
				"max_restarts": c.MaxRestarts, "module": c.Module, "no_python": c.NoPython, "role": c.Role,
				"log_dir": c.LogDir, "redirects": stdSpecString(c.Redirects), "tee": stdSpecString(c.Tee),
				"rdzv_backend": c.RdzvBackend, "rdzv_endpoint": c.RdzvEndpoint, "rdzv_id": orNone(c.RdzvID),
				"master_addr": orDefault(c.MasterAddr, "127.0.0.1"), "master_port": portOrDefault(c.MasterPort),
				"monitor_interval": c.MonitorInterval.Seconds(), "script": c.Script, "script_args": scriptArgs,
			}
			wantNorm := map[string]any{}
			for k, v := range w {
				switch v := v.(type) {
				case float64:
					if k == "monitor_interval" {
						wantNorm[k] = v
					} else {
						wantNorm[k] = int(v)
					}
				case []any:
					wantNorm[k] = scriptArgs
				default:
					wantNorm[k] = v
				}
			}
			wantNorm["nnodes"] = nnodes
			wantNorm["redirects"] = torchStd(w["redirects"].(string))
			wantNorm["tee"] = torchStd(w["tee"].(string))
			for k := range wantNorm {
				if !reflect.DeepEqual(got[k], wantNorm[k]) {
					t.Errorf("%s: got %v, want torchrun's %v", k, got[k], wantNorm[k])
				}
			}
		})
	}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// portOrDefault maps "pick a free port" to torchrun's parsed default, 29500.
func portOrDefault(p int) int {
	if p == 0 {
		return 29500
	}
	return p
}

// stdSpecString renders a StdSpec the way torchrun's raw string reads once
// normalized by torchStd.
func stdSpecString(s StdSpec) string {
	if s.PerRank == nil {
		return string(rune('0' + s.All))
	}
	var parts []string
	for r := 0; r < 16; r++ {
		if v, ok := s.PerRank[r]; ok {
			parts = append(parts, string(rune('0'+r))+":"+string(rune('0'+v)))
		}
	}
	return strings.Join(parts, ",")
}

// torchStd normalizes torchrun's raw --redirects/--tee string.
func torchStd(s string) string { return strings.ReplaceAll(s, " ", "") }

package launch

import (
	"strings"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// fromEnvironment is the flags' values before the command line: the
// defaults, PET_<FLAG> as torchrun reads them, the token and plugins from
// ddp-agent's own variables, and the interpreter from PYTHON_EXEC or
// DDP_AGENT_PYTHON. set holds the flags given through PET_*; fromEnv the
// ones that only the environment may give without contradicting other
// flags (dropEnvOnly), for the command-line loop to clear as it meets them.
func fromEnvironment(getenv func(string) string) (raw rawFlags, set, fromEnv map[string]bool) {
	raw, set = rawFlags{}, map[string]bool{} // set: given on the command line or through PET_*
	for _, f := range flagSpecs {
		raw[f.name] = f.def
		if v := getenv("PET_" + strings.ToUpper(strings.ReplaceAll(f.name, "-", "_"))); v != "" {
			raw[f.name] = v
			set[f.name] = true
		}
	}
	raw["rdzv-token"] = getenv(envname.RdzvToken) // a secret is better kept out of argv
	raw["plugins-env"] = getenv(envname.Plugins)
	// torchrun runs workers under its own interpreter, or PYTHON_EXEC.
	for _, env := range []string{"PYTHON_EXEC", envname.Python} {
		if v := getenv(env); v != "" {
			raw["python"] = v
		}
	}
	fromEnv = map[string]bool{}
	for _, name := range []string{"node-rank", "master-addr", "master-port"} {
		fromEnv[name] = set[name]
	}
	return raw, set, fromEnv
}

// dropEnvOnly forgets what only the environment gave, where it would
// contradict the command line. torchrun reads PET_NODE_RANK only for the
// static backend, and Kubeflow Trainer sets it on every pod whatever the
// backend: from the environment it does not contradict a store's ranks as
// --node-rank does. So with PET_MASTER_ADDR and PET_MASTER_PORT, which
// Kubeflow sets too, under --standalone, c10d and etcd: torchrun ignores
// them there (run.py: "master_port is only used for the static rendezvous
// backend"). Under c10d, PET_MASTER_PORT had pinned every attempt's
// workers' store to one port, which a manifest does not declare, where
// the docs promise a free port per attempt.
func (r rawFlags) dropEnvOnly(set, fromEnv map[string]bool) {
	if fromEnv["node-rank"] {
		delete(set, "node-rank")
	}
	standalone, err := r.bool("standalone")
	if err != nil { // a bad value is fill's to report
		return
	}
	if !standalone && r["rdzv-backend"] == "static" {
		return
	}
	for _, f := range flagSpecs {
		if (f.name == "master-addr" || f.name == "master-port") && fromEnv[f.name] {
			delete(set, f.name)
			r[f.name] = f.def
		}
	}
}

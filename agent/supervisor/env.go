package supervisor

import (
	"cmp"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/ddp-agent/ddp-agent/internal/envname"
)

// Worker identifies one worker process within the job.
type Worker struct {
	LocalRank int
	Rank      int // global rank
}

// workerEnv is the environment of one worker: base (the agent's own
// environment) with torchrun's variables and ddp-agent's added on top, so a
// script written for torchrun runs unchanged.
// errorFile and noteFile are its TORCHELASTIC_ERROR_FILE and
// DDP_AGENT_COMM_NOTE_FILE.
func workerEnv(base []string, s *Spec, w Worker, errorFile, noteFile string, placed map[string]string) []string {
	set := map[string]string{
		"LOCAL_RANK":                strconv.Itoa(w.LocalRank),
		"RANK":                      strconv.Itoa(w.Rank),
		"ROLE_RANK":                 strconv.Itoa(w.Rank), // one role per job: the role rank is the rank
		"ROLE_NAME":                 s.Role,
		"LOCAL_WORLD_SIZE":          strconv.Itoa(s.NProc),
		"TORCHELASTIC_MAX_RESTARTS": strconv.Itoa(s.MaxRestarts),
		"TORCHELASTIC_RUN_ID":       s.RunID,
		// torchrun hosts the workers' TCPStore in the agent and says so with True;
		// ddp-agent does with AgentStore (store.go), and otherwise rank 0's
		// worker hosts it, as with plain env:// init.
		"TORCHELASTIC_USE_AGENT_STORE": pyBool(s.AgentStore),
		"TORCHELASTIC_ERROR_FILE":      errorFile,
		envname.Socket:                 s.ControlSocket,
		envname.Bootstrap:              s.Bootstrap,
		// where the shim notes when it closed, and a collective that a peer failed
		envname.CommNoteFile: noteFile,
	}
	maps.Copy(set, worldEnv(s)) // the world's size, the node's rank, the generation, the store
	if s.VirtualLocalRank {
		set["LOCAL_RANK"] = "0"
	}
	if s.WorldFile != "" {
		set[envname.WorldFile] = s.WorldFile
	}
	if s.Join {
		set[envname.Join] = "1"
	}
	have := map[string]bool{}
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		have[k] = true
	}
	// Defaults that the user's own environment overrides, as in torchrun.
	if !have["OMP_NUM_THREADS"] && s.NProc > 1 {
		set["OMP_NUM_THREADS"] = "1"
	}
	for _, k := range asyncErrorHandlingVars(s.TorchVersion) {
		if !have[k] {
			set[k] = "1"
		}
	}
	// PyTorch 2.x's torchrun tells its workers which signals it stops on
	// and forwards to them (--signals-to-handle; its default when unset).
	if !have["TORCHELASTIC_SIGNALS_TO_HANDLE"] {
		set["TORCHELASTIC_SIGNALS_TO_HANDLE"] = cmp.Or(s.SignalsToHandle, "SIGTERM,SIGINT,SIGHUP,SIGQUIT")
	}
	if s.ControlSocket == "" {
		delete(set, envname.Socket)
	}
	if s.Bootstrap == "" {
		delete(set, envname.Bootstrap)
	}

	env := make([]string, 0, len(base)+len(placed)+len(set))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		_, ours := set[k]
		_, isPlaced := placed[k]
		if !ours && !isPlaced {
			env = append(env, kv)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(placed)) {
		if _, ours := set[k]; !ours {
			env = append(env, k+"="+placed[k])
		}
	}
	for _, k := range envOrder {
		if v, ok := set[k]; ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// envOrder fixes the order of the variables we set, so a worker's
// environment is the same from run to run.
var envOrder = []string{
	"LOCAL_RANK", "RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME",
	"LOCAL_WORLD_SIZE", "WORLD_SIZE", "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE",
	"MASTER_ADDR", "MASTER_PORT",
	"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
	"TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_SIGNALS_TO_HANDLE",
	"OMP_NUM_THREADS", "NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING",
	envname.Socket, envname.Generation, envname.Bootstrap, envname.CommNoteFile, envname.WorldFile, envname.Join,
}

// pyBool is b as Python writes it, which torch compares the variable to.
func pyBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

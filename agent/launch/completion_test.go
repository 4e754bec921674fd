package launch

import (
	"errors"
	"os/exec"
	"strings"
	"testing"
)

// TestPrintCompletion: --print-completion bash prints a script that real
// bash completes run's flags and the commands with; an unknown shell is a
// usage error.
func TestPrintCompletion(t *testing.T) {
	_, err := Parse([]string{"--print-completion", "bash"}, noEnv, fourCPUs)
	var c *CompletionError
	if !errors.As(err, &c) || !strings.Contains(c.Script, "complete -F _ddp_agent ddp-agent") {
		t.Fatalf("Parse: %v", err)
	}
	if _, err := Parse([]string{"--print_completion=fish"}, noEnv, fourCPUs); err == nil || !strings.Contains(err.Error(), "not bash, zsh or tcsh") {
		t.Errorf("fish: %v", err)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	out, err := exec.Command(bash, "-c", c.Script+`
COMP_WORDS=(ddp-agent run --nproc); COMP_CWORD=2; _ddp_agent; echo "${COMPREPLY[*]}"
COMP_WORDS=(ddp-agent sid); COMP_CWORD=1; _ddp_agent; echo "${COMPREPLY[*]}"`).CombinedOutput()
	if err != nil || string(out) != "--nproc-per-node --nproc_per_node\nsidecar\n" {
		t.Errorf("bash completed %q (%v)", out, err)
	}
}

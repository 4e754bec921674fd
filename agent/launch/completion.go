package launch

import (
	"fmt"
	"strings"
)

// CompletionError is Parse's answer to --print-completion SHELL, as
// torchrun's: not a failure, but what to print (Script) before exiting 0.
type CompletionError struct{ Script string }

func (e *CompletionError) Error() string { return "shell completion requested" }

// completion is the completion script of ddp-agent for shell: its
// commands, and run's flags (both spellings) after run.
func completion(shell string) (string, error) {
	commands := "run sidecar status topo plugins token version help"
	var flags []string
	for _, f := range flagSpecs {
		flags = append(flags, "--"+f.name)
		if u := strings.ReplaceAll(f.name, "-", "_"); u != f.name {
			flags = append(flags, "--"+u)
		}
	}
	all := strings.Join(flags, " ")
	switch shell {
	case "bash", "zsh":
		s := fmt.Sprintf(`_ddp_agent() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur"))
  elif [ "${COMP_WORDS[1]}" = run ] && [ "${cur#-}" != "$cur" ]; then
    COMPREPLY=($(compgen -W "%s" -- "$cur"))
  else
    COMPREPLY=($(compgen -f -- "$cur"))
  fi
}
complete -F _ddp_agent ddp-agent
`, commands, all)
		if shell == "zsh" {
			s = "autoload -U +X bashcompinit && bashcompinit\n" + s
		}
		return s, nil
	case "tcsh":
		return fmt.Sprintf("complete ddp-agent 'p/1/(%s)/' 'c/--/(%s)/' 'n/*/f/'\n", commands, strings.ReplaceAll(all, "--", "")), nil
	}
	return "", usagef("--print-completion: %q is not bash, zsh or tcsh", shell)
}

package launch

import (
	"errors"
	"io/fs"
	"os/exec"
	"strings"
)

// Finder is how CheckCommand looks at the machine: os.Stat and
// exec.LookPath in the agent, fakes in tests.
type Finder struct {
	Stat     func(path string) (fs.FileInfo, error)
	LookPath func(file string) (string, error)
}

// CheckCommand refuses, in one line, a worker command that cannot start:
// a script that is not there (relative to the agent's directory, where
// the workers start), an interpreter or a --no-python program not found.
// Without it every worker starts, fails at once, and the job fails after
// its restarts with exit 1, for what is a typo. A module (-m) is left to
// Python: finding it means importing.
func (c *Config) CheckCommand(f Finder) error {
	if !c.NoPython {
		if _, err := f.LookPath(c.Python); err != nil {
			return usagef("--python %s: not found (%v); give an interpreter that has torch", c.Python, unwrapExec(err))
		}
	}
	switch {
	case c.Module:
		return nil
	case c.NoPython && !strings.Contains(c.Script, "/"):
		if _, err := f.LookPath(c.Script); err != nil {
			return usagef("%s: not found in $PATH (--no-python runs the script as a program)", c.Script)
		}
		return nil
	}
	fi, err := f.Stat(c.Script)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return usagef("%s: no such file (the training script, relative to the directory ddp-agent runs in)", c.Script)
	case err != nil:
		return usagef("%s: %v", c.Script, err)
	case fi.IsDir():
		return usagef("%s is a directory: name the training script", c.Script)
	case c.NoPython && fi.Mode().Perm()&0o111 == 0:
		// exec would fail for every worker, as an "agent error" at start.
		return usagef("%s is not executable (--no-python runs the script as a program): chmod +x it, or drop --no-python", c.Script)
	}
	return nil
}

// unwrapExec drops exec's wrapping ("exec: \"x\": executable file not
// found in $PATH"): the message names the file already.
func unwrapExec(err error) error {
	var ee *exec.Error
	if errors.As(err, &ee) {
		return ee.Err
	}
	return err
}

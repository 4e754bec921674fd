package pluginhost

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ddp-agent/ddp-agent/plugins"
)

// BundledBinary is the executable that serves the bundled plugins
// (`ddp-agent-plugins NAME`), found next to ddp-agent.
const BundledBinary = "ddp-agent-plugins"

// Spec is one --plugin: a bundled plugin by name, or an external one by
// path, and its settings.
type Spec struct {
	Name   string // the bundled name ("exec"), or the external binary's base name
	Path   string // the external binary; "" for a bundled plugin
	Config plugins.Config
	Raw    string // as given, for messages
}

// ParseSpec reads NAME[,key=value...] or /path/to/binary[,key=value...].
// A value may itself hold commas (nic,interfaces=eth0,eth1): a part
// without '=' continues the value before it.
func ParseSpec(s string) (Spec, error) {
	s = strings.TrimSpace(s)
	parts := strings.Split(s, ",")
	sp := Spec{Config: plugins.Config{}, Raw: s}
	head := strings.TrimSpace(parts[0])
	switch {
	case head == "":
		return Spec{}, fmt.Errorf("--plugin %q: no plugin name (want NAME[,key=value...] or /path/to/plugin[,key=value...])", s)
	case strings.ContainsRune(head, '/'):
		sp.Path, sp.Name = head, filepath.Base(head)
	case strings.ContainsRune(head, '='):
		return Spec{}, fmt.Errorf("--plugin %q: the plugin's name comes first (want NAME[,key=value...])", s)
	default:
		sp.Name = head
	}
	last := ""
	for _, p := range parts[1:] {
		k, v, ok := strings.Cut(p, "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok && last == "":
			return Spec{}, fmt.Errorf("--plugin %q: %q is not key=value", s, p)
		case !ok:
			sp.Config[last] += "," + p
			continue
		case k == "":
			return Spec{}, fmt.Errorf("--plugin %q: %q has no key", s, p)
		}
		if _, dup := sp.Config[k]; dup {
			return Spec{}, fmt.Errorf("--plugin %q: key %q given twice", s, k)
		}
		sp.Config[k], last = v, k
	}
	return sp, nil
}

// ParseSpecs reads every --plugin, and DDP_AGENT_PLUGINS's specs
// (separated by ';') when no --plugin was given.
func ParseSpecs(flags []string, env string) ([]Spec, error) {
	raw := flags
	if len(raw) == 0 && strings.TrimSpace(env) != "" {
		raw = strings.Split(env, ";")
	}
	var specs []Spec
	for _, r := range raw {
		if strings.TrimSpace(r) == "" {
			continue
		}
		sp, err := ParseSpec(r)
		if err != nil {
			return nil, err
		}
		specs = append(specs, sp)
	}
	return specs, nil
}

// command is the program and arguments that serve the plugin: an external
// binary as it is, a bundled plugin through ddp-agent-plugins in dir.
func (s Spec) command(dir string) (string, []string, error) {
	if s.Path != "" {
		if err := runnable(s.Path); err != nil {
			return "", nil, err // names the path, and RefusedError the plugin
		}
		return s.Path, nil, nil
	}
	bin := filepath.Join(dir, BundledBinary)
	switch err := runnable(bin); {
	case errors.Is(err, fs.ErrNotExist):
		return "", nil, fmt.Errorf("plugin %s: the bundled plugins' binary is missing (%w); `make build` puts it next to ddp-agent, or set DDP_AGENT_PLUGIN_DIR", s.Name, err)
	case err != nil:
		return "", nil, fmt.Errorf("plugin %s: the bundled plugins' binary: %w", s.Name, err)
	}
	return bin, []string{s.Name}, nil
}

// runnable refuses a path that cannot be executed: missing, not a
// regular file (a directory), or not executable by this process (no x
// bit for it, a noexec mount). Started, each fails with "permission
// denied" at every restart, forever; refused, the user hears it once,
// before the job starts.
func runnable(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		what := "not a regular file"
		if fi.IsDir() {
			what = "a directory"
		}
		return fmt.Errorf("%s: %s, not an executable", path, what)
	}
	// access(2) answers for this process's user, and for a noexec mount.
	if err := unix.Access(path, unix.X_OK); err != nil {
		return fmt.Errorf("%s: not executable (mode %s): %w", path, fi.Mode().Perm(), err)
	}
	return nil
}

// BundledDir is where ddp-agent-plugins is looked for: $DDP_AGENT_PLUGIN_DIR,
// else the directory of the running executable.
func BundledDir(env string) string {
	if env != "" {
		return env
	}
	exe, err := os.Executable()
	if err != nil {
		return "."
	}
	if real, err := filepath.EvalSymlinks(exe); err == nil {
		exe = real
	}
	return filepath.Dir(exe)
}

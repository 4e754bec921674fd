package launch

import (
	"errors"
	"io/fs"
	"strings"
	"testing"
	"testing/fstest"
)

func TestCheckCommand(t *testing.T) {
	files := fstest.MapFS{"train.py": {}, "dir": {Mode: fs.ModeDir}, "bin/run.sh": {Mode: 0o755}, "bin/plain.sh": {Mode: 0o644}}
	f := Finder{
		Stat: func(p string) (fs.FileInfo, error) { return fs.Stat(files, p) },
		LookPath: func(file string) (string, error) {
			if file == "python3" || file == "/usr/bin/python3" || file == "sleep" {
				return "/usr/bin/" + file, nil
			}
			return "", errors.New("executable file not found in $PATH")
		},
	}
	for _, tc := range []struct {
		cfg  Config
		want string // "" : accepted
	}{
		{Config{Python: "python3", Script: "train.py"}, ""},
		{Config{Python: "python3", Script: "nope.py"}, "nope.py: no such file"},
		{Config{Python: "python3", Script: "dir"}, "dir is a directory"},
		{Config{Python: "python9", Script: "train.py"}, "--python python9: not found"},
		{Config{Python: "python3", Script: "pkg.mod", Module: true}, ""},
		{Config{NoPython: true, Python: "python9", Script: "sleep"}, ""},
		{Config{NoPython: true, Script: "frob"}, "frob: not found in $PATH"},
		{Config{NoPython: true, Script: "./run.sh"}, "./run.sh: no such file"},
		{Config{NoPython: true, Script: "bin/run.sh"}, ""},
		{Config{NoPython: true, Script: "bin/plain.sh"}, "bin/plain.sh is not executable"},
	} {
		err := tc.cfg.CheckCommand(f)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%+v: %v", tc.cfg, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%+v: got %v, want %q", tc.cfg, err, tc.want)
		case err != nil:
			var ue *UsageError
			if !errors.As(err, &ue) {
				t.Errorf("%+v: %T, want a *UsageError (exit 2)", tc.cfg, err)
			}
		}
	}
}

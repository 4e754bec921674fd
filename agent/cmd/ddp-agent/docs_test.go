package main

import (
	"bytes"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSidecarFlagsDocumented: docs/sidecar.md's flag table and the flags
// `ddp-agent sidecar` takes (its -h) are the same set.
func TestSidecarFlagsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/sidecar.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("(?m)^\\| `--([a-z][a-z-]*)").FindAllStringSubmatch(string(doc), -1) {
		documented[m[1]] = true
	}
	var help bytes.Buffer
	_, _, _ = sidecarFlags([]string{"-h"}, func(string) string { return "" }, &help)
	taken := regexp.MustCompile(`(?m)^  --([a-z][a-z-]*)`).FindAllStringSubmatch(help.String(), -1)
	if len(taken) < 5 {
		t.Fatalf("found %d flags in the sidecar's -h:\n%s", len(taken), help.String())
	}
	for _, m := range taken {
		if !documented[m[1]] {
			t.Errorf("--%s is not in docs/sidecar.md's flag table", m[1])
		}
		delete(documented, m[1])
	}
	for name := range documented {
		t.Errorf("docs/sidecar.md documents --%s, which ddp-agent sidecar does not take", name)
	}
}

// TestDocumentedCommandsParse: every ddp-agent command line the docs show
// (in a code block or a `code span`) names a command the binary has and
// only flags that command takes, as its help lists them. A flag renamed
// or dropped in the code then fails here until the docs follow.
func TestDocumentedCommandsParse(t *testing.T) {
	flags := map[string]map[string]bool{}
	for _, cmd := range []string{"run", "sidecar", "status", "topo", "plugins", "token", "version"} {
		var help, errs bytes.Buffer
		if code := run([]string{"help", cmd}, &help, &errs); code != 0 {
			t.Fatalf("ddp-agent help %s: exit %d: %s", cmd, code, errs.String())
		}
		flags[cmd] = map[string]bool{"h": true, "help": true}
		for _, m := range helpFlagRE.FindAllStringSubmatch(help.String(), -1) {
			flags[cmd][m[1]] = true
		}
	}
	if len(flags["run"]) < 25 || len(flags["status"]) < 6 {
		t.Fatalf("found %d flags in run's help and %d in status's: has the help's layout changed?", len(flags["run"]), len(flags["status"]))
	}
	checked := 0
	for _, doc := range markdownFiles(t) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range codeLines(string(b)) {
			for _, m := range commandRE.FindAllStringSubmatchIndex(line, -1) {
				name := line[m[2]:m[3]]
				if name == "help" {
					continue
				}
				taken, ok := flags[name]
				if !ok {
					continue // prose in code, as `ddp-agent sidecar: collective hung`
				}
				checked++
				for _, tok := range strings.Fields(line[m[1]:]) {
					tok = strings.Trim(tok, "[]") // [--rdzv-id ID]
					if commandEnd(tok) {
						break
					}
					if !strings.HasPrefix(tok, "-") || tok == "-" {
						continue
					}
					flag := strings.ReplaceAll(strings.TrimLeft(strings.SplitN(tok, "=", 2)[0], "-"), "_", "-")
					if !taken[flag] {
						t.Errorf("%s: `%s` gives %s, which ddp-agent %s does not take", rel(doc), strings.TrimSpace(line), tok, name)
					}
				}
			}
		}
	}
	if checked < 30 {
		t.Fatalf("checked %d documented command lines: were the docs' code blocks found?", checked)
	}
}

// helpFlagRE finds the flags of a help text: the first word of an
// indented line, with one dash (Go's flag package) or two.
var helpFlagRE = regexp.MustCompile(`(?m)^ {2,}--?([a-z][a-z0-9-]*)`)

// commandRE finds `ddp-agent COMMAND` (also bin/ddp-agent and the like).
var commandRE = regexp.MustCompile(`(?:^|[\s/$(` + "`" + `])ddp-agent ([a-z]+)\b`)

// commandEnd says where a command line stops being ddp-agent's: at the
// script (whose flags are its own), an elision, a comment or a shell
// operator.
func commandEnd(tok string) bool {
	switch tok {
	case "...", "…", "--", "#", "|", "||", "&", "&&", ";", ">", ">>", "2>&1", "-m":
		return true
	}
	return strings.HasSuffix(tok, ".py") || strings.HasPrefix(tok, "#") || strings.HasPrefix(tok, "$(") ||
		strings.ContainsAny(tok, "`")
}

// codeLines returns the lines of a markdown file's fenced code blocks (a
// line continued with \ joined to the next) and its inline code spans.
func codeLines(md string) []string {
	var out []string
	fenced, cont := false, ""
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			if strings.HasSuffix(line, `\`) {
				cont += strings.TrimSuffix(line, `\`) + " "
				continue
			}
			out = append(out, cont+line)
			cont = ""
			continue
		}
		for _, m := range spanRE.FindAllStringSubmatch(line, -1) {
			out = append(out, m[1])
		}
	}
	return out
}

var spanRE = regexp.MustCompile("`([^`]+)`")

// markdownFiles are the repository's documents a user reads: README.md,
// docs/ (not the device runs' logs), deploy/'s and examples' READMEs.
func markdownFiles(t *testing.T) []string {
	root := filepath.Join("..", "..", "..")
	var files []string
	for _, pattern := range []string{"*.md", "docs/*.md", "deploy/*.md", "deploy/*/*.md", "examples/*.md", "examples/*/*.md", "python/*.md"} {
		m, err := filepath.Glob(filepath.Join(root, pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 10 {
		t.Fatalf("found %d markdown files under %s", len(files), root)
	}
	return files
}

// rel names a document by its path in the repository.
func rel(path string) string {
	return strings.TrimPrefix(filepath.ToSlash(path), "../../../")
}

// TestDocumentedNamesExist: the environment variables (DDP_AGENT_*) the
// docs name are read or set somewhere in the code, scripts or manifests,
// and the make targets they give are the Makefile's.
func TestDocumentedNamesExist(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	envRE := regexp.MustCompile(`\bDDP_AGENT_[A-Z0-9_]*[A-Z0-9]\b`)
	used := map[string]bool{}
	for _, name := range envRE.FindAllString(sourceText(t, root), -1) {
		used[name] = true
	}
	makefile, err := os.ReadFile(filepath.Join(root, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^([a-z][a-z0-9-]*):`).FindAllStringSubmatch(string(makefile), -1) {
		targets[m[1]] = true
	}
	makeRE := regexp.MustCompile(`(?:^|[\s(])make ([a-z][a-z0-9-]*)`)
	vars, makes := 0, 0
	for _, doc := range markdownFiles(t) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range envRE.FindAllString(string(b), -1) {
			vars++
			if !used[name] {
				t.Errorf("%s names $%s, which no code, script or manifest uses", rel(doc), name)
			}
		}
		for _, line := range codeLines(string(b)) {
			for _, m := range makeRE.FindAllStringSubmatch(line, -1) {
				makes++
				if !targets[m[1]] {
					t.Errorf("%s: `%s` runs make %s, which the Makefile does not have", rel(doc), strings.TrimSpace(line), m[1])
				}
			}
		}
	}
	if vars < 50 || makes < 20 {
		t.Fatalf("found %d variable names and %d make commands in the docs: were they read?", vars, makes)
	}
}

// sourceText is every file of the repository that is not documentation
// (Go, Python, C, shell, Makefile, CI, manifests), joined.
func sourceText(t *testing.T, root string) string {
	var b strings.Builder
	walkRepo(t, root, func(path string, testdata bool) {
		switch filepath.Ext(path) {
		case ".go", ".py", ".c", ".h", ".sh", ".yaml", ".yml", ".sbatch", ".toml":
		default:
			if name := filepath.Base(path); name != "Makefile" && name != "run" {
				return
			}
		}
		src, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(src)
		b.WriteByte('\n')
	})
	return b.String()
}

// walkRepo calls visit with every file of the repository's tree that is
// its own (not .git, caches, build outputs or the device runs' logs), and
// whether it lies under a testdata directory.
func walkRepo(t *testing.T, root string, visit func(path string, testdata bool)) {
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", ".cache", "node_modules", "bin", "__pycache__", "gpu-runs":
				return filepath.SkipDir
			}
			return nil
		}
		visit(path, strings.Contains(filepath.ToSlash(path), "/testdata/"))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

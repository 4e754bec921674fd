package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// TestQuotedLogLinesExist: every log message the docs quote (msg="...")
// is made of words the code still writes. The message is cut where a
// value goes (numbers, durations, a host, "..."), and each piece of three
// words or more must be in a string literal of the module's Go code: a
// reworded line in the code then fails here until the docs say it too.
func TestQuotedLogLinesExist(t *testing.T) {
	root := filepath.Join("..", "..", "..")
	literals := goLiterals(t, root)
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"))
	msgRE := regexp.MustCompile(`msg="([^"]+)"`)
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgRE.FindAllStringSubmatch(string(b), -1) {
			for _, piece := range quotedPieces(m[1]) {
				checked++
				if !strings.Contains(literals, piece) {
					t.Errorf("%s quotes %q, but no Go string literal holds %q", filepath.Base(doc), m[1], piece)
				}
			}
		}
	}
	if checked < 20 {
		t.Fatalf("checked %d pieces of quoted messages: the docs' msg=\"...\" were not found", checked)
	}
}

// valueRE matches what varies in a log message: numbers with their
// units, an ellipsis, a parenthesized host and pid.
var valueRE = regexp.MustCompile(`\(vm, pid [0-9]+\)|[0-9][0-9.e+-]*(ms|µs|s|%|B)?|\.\.\.|[():;,]`)

// quotedPieces cuts a quoted message where values go and keeps the pieces
// of three words or more.
func quotedPieces(msg string) []string {
	var out []string
	for _, p := range valueRE.Split(msg, -1) {
		p = strings.TrimSpace(p)
		if len(strings.Fields(p)) >= 3 {
			out = append(out, p)
		}
	}
	return out
}

// goLiterals returns every string literal of the module's non-test Go
// files (literals joined by + as one), joined by newlines.
func goLiterals(t *testing.T, root string) string {
	var b strings.Builder
	walkRepo(t, root, func(path string, testdata bool) {
		if testdata || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			if e, ok := n.(ast.Expr); ok {
				if v, ok := constString(e); ok {
					b.WriteString(v)
					b.WriteByte('\n')
					return false // its parts are in it
				}
			}
			return true
		})
	})
	return b.String()
}

// constString is the value of a string literal, or of literals joined by
// + (a long format string split over lines).
func constString(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if e.Kind != token.STRING {
			return "", false
		}
		v, err := strconv.Unquote(e.Value)
		return v, err == nil
	case *ast.BinaryExpr:
		if e.Op != token.ADD {
			return "", false
		}
		x, ok := constString(e.X)
		if !ok {
			return "", false
		}
		y, ok := constString(e.Y)
		return x + y, ok
	case *ast.ParenExpr:
		return constString(e.X)
	}
	return "", false
}

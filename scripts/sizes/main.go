// Command sizes lists the longest Go files and functions of the module and
// fails when one is over the house limits, so that a file or a function that
// has grown two concepts is split before it lands (make lint, make test).
//
//	go run ./scripts/sizes [-top 5] [-max-file 800] [-max-func 120] [dir]
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

type item struct {
	name  string
	lines int
}

func main() {
	top := flag.Int("top", 5, "how many of the longest files and functions to list")
	maxFile := flag.Int("max-file", 800, "most lines a Go file may have (0: no limit)")
	maxFunc := flag.Int("max-func", 120, "most lines a function may have (0: no limit)")
	flag.Parse()
	root := "."
	if flag.NArg() > 0 {
		root = flag.Arg(0)
	}
	files, funcs, err := measure(root)
	if err != nil {
		fmt.Fprintln(os.Stderr, "sizes:", err)
		os.Exit(2)
	}
	bad := report("files", files, *top, *maxFile)
	bad += report("functions", funcs, *top, *maxFunc)
	if bad > 0 {
		os.Exit(1)
	}
}

// measure walks root's Go files (skipping hidden dirs and testdata) and
// returns each file's and each function's length in lines.
func measure(root string) (files, funcs []item, err error) {
	fset := token.NewFileSet()
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return fmt.Errorf("parse %s: %w", path, err)
		}
		files = append(files, item{path, fset.File(f.Pos()).LineCount()})
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			var label string
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body, label = fn.Body, fn.Name.Name
				if fn.Recv != nil && len(fn.Recv.List) > 0 {
					label = recvName(fn.Recv.List[0].Type) + "." + label
				}
			case *ast.FuncLit:
				body, label = fn.Body, "func literal"
			}
			if body == nil {
				return true
			}
			start := fset.Position(n.Pos())
			lines := fset.Position(body.End()).Line - start.Line + 1
			funcs = append(funcs, item{fmt.Sprintf("%s:%d %s", path, start.Line, label), lines})
			return true
		})
		return nil
	})
	return files, funcs, err
}

func recvName(e ast.Expr) string {
	switch t := e.(type) {
	case *ast.StarExpr:
		return recvName(t.X)
	case *ast.IndexExpr:
		return recvName(t.X)
	case *ast.IndexListExpr:
		return recvName(t.X)
	case *ast.Ident:
		return t.Name
	}
	return "?"
}

// report prints the top longest items and every one over limit; it returns
// how many are over.
func report(what string, items []item, top, limit int) int {
	sort.Slice(items, func(i, j int) bool { return items[i].lines > items[j].lines })
	fmt.Printf("longest %s:\n", what)
	over := 0
	for i, it := range items {
		tooLong := limit > 0 && it.lines > limit
		if i >= top && !tooLong {
			break
		}
		mark := ""
		if tooLong {
			mark = fmt.Sprintf("  (over %d)", limit)
			over++
		}
		fmt.Printf("  %5d  %s%s\n", it.lines, it.name, mark)
	}
	return over
}

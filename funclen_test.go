package main

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines is the house limit on a function's length, from its func keyword to its closing brace.
// A longer function is a list of steps that want names of their own.
const maxFuncLines = 100

// TestFunctionLength fails on any function or function literal of the daemon's code longer than maxFuncLines.
// Tests and the e2e tree are exempt: a table-driven test or a harness scenario reads best in one piece.
func TestFunctionLength(t *testing.T) {
	fset := token.NewFileSet()
	var long []string
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch name := d.Name(); {
			case path == "e2e", path == "bin", path == "dist", name == "testdata",
				path != "." && strings.HasPrefix(name, "."):
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			var body *ast.BlockStmt
			name := "function literal"
			switch fn := n.(type) {
			case *ast.FuncDecl:
				body, name = fn.Body, fn.Name.Name
			case *ast.FuncLit:
				body = fn.Body
			}
			if body == nil {
				return true
			}
			start := fset.Position(n.Pos())
			if lines := fset.Position(body.Rbrace).Line - start.Line + 1; lines > maxFuncLines {
				long = append(long, fmt.Sprintf("%s %s: %d lines", start, name, lines))
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(long) > 0 {
		t.Errorf("functions longer than %d lines (split them into named steps):\n  %s", maxFuncLines, strings.Join(long, "\n  "))
	}
}

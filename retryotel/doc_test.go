package retryotel_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sbretryName is a name of ours in a comment: "sbretry." and at least one dotted segment.
var sbretryName = regexp.MustCompile(`sbretry(\.[a-z_]+)+`)

// exportedNames returns the values of the package's exported Metric* and Attr* constants, read from
// its source, by constant name.
func exportedNames(t *testing.T, files []*ast.File) (metrics, attrs map[string]string) {
	t.Helper()
	metrics, attrs = map[string]string{}, map[string]string{}
	for _, f := range files {
		ast.Inspect(f, func(n ast.Node) bool {
			vs, ok := n.(*ast.ValueSpec)
			if !ok || len(vs.Names) != 1 || len(vs.Values) != 1 {
				return true
			}
			name := vs.Names[0].Name
			var lit *ast.BasicLit
			switch v := vs.Values[0].(type) {
			case *ast.BasicLit:
				lit = v
			case *ast.CallExpr: // attribute.Key("...")
				if len(v.Args) == 1 {
					lit, _ = v.Args[0].(*ast.BasicLit)
				}
			}
			if lit == nil || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			switch {
			case strings.HasPrefix(name, "Metric"):
				metrics[name] = s
			case strings.HasPrefix(name, "Attr"):
				attrs[name] = s
			}
			return true
		})
	}
	return metrics, attrs
}

// The names the documentation gives are the names the code exports: every sbretry.* name in any doc
// comment is an exported metric or attribute, and the package doc's Metrics section lists exactly the
// exported metrics.
func TestDocumentedNamesAreExported(t *testing.T) {
	fset := token.NewFileSet()
	paths, err := filepath.Glob("*.go")
	require.NoError(t, err)
	var files []*ast.File
	for _, p := range paths {
		if strings.HasSuffix(p, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ParseComments)
		require.NoError(t, err)
		files = append(files, f)
	}
	metrics, attrs := exportedNames(t, files)
	require.NotEmpty(t, metrics)
	known := map[string]bool{}
	for _, v := range metrics {
		known[v] = true
	}
	for _, v := range attrs {
		known[v] = true
	}

	var doc string
	for _, f := range files {
		for _, cg := range f.Comments {
			for _, name := range sbretryName.FindAllString(cg.Text(), -1) {
				assert.True(t, known[name], "%s: a comment names %s, which is no exported metric or attribute", fset.Position(cg.Pos()), name)
			}
		}
		if f.Doc != nil {
			doc += f.Doc.Text()
		}
	}

	_, section, ok := strings.Cut(doc, "# Metrics\n")
	require.True(t, ok, "the package doc has a Metrics section")
	listed := map[string]bool{}
	for _, name := range sbretryName.FindAllString(section, -1) {
		// An attribute named in the section (sbretry.source.name) is not a metric; sbretry.consumer.state
		// is both.
		if slices.Contains(slices.Collect(maps.Values(metrics)), name) || !slices.Contains(slices.Collect(maps.Values(attrs)), name) {
			listed[name] = true
		}
	}
	assert.ElementsMatch(t, slices.Collect(maps.Values(metrics)), slices.Collect(maps.Keys(listed)), "the package doc's Metrics section lists the exported metrics")
}

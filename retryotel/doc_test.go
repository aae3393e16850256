package retryotel_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
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

// The setup a reader meets first is the one that follows the conventions: the package doc's, ExampleNew
// and the first code block of docs/observability.md all wrap the connector as well as the hooks, since
// only the connector brings server.address, server.port and the renew_message_lock spans.
func TestPrimarySetupWrapsTheConnector(t *testing.T) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "example_test.go", nil, 0)
	require.NoError(t, err)
	var calls []string
	for _, decl := range f.Decls {
		fn, ok := decl.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "ExampleNew" {
			continue
		}
		ast.Inspect(fn.Body, func(n ast.Node) bool {
			if call, ok := n.(*ast.CallExpr); ok {
				if sel, ok := call.Fun.(*ast.SelectorExpr); ok {
					calls = append(calls, sel.Sel.Name)
				}
			}
			return true
		})
	}
	require.NotEmpty(t, calls, "ExampleNew exists")
	assert.Contains(t, calls, "Connector", "ExampleNew wraps the connector")
	assert.Contains(t, calls, "Hooks", "ExampleNew installs the hooks")

	pkg, err := parser.ParseFile(fset, "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	_, setup, ok := strings.Cut(pkg.Doc.Text(), "Setup")
	require.True(t, ok, "the package doc shows the setup")
	setup, _, _ = strings.Cut(setup, "\n\n\n")
	assert.Contains(t, firstIndentedBlock(setup), "inst.Connector(", "the package doc's setup wraps the connector")

	md, err := os.ReadFile(filepath.Join("..", "docs", "observability.md"))
	require.NoError(t, err)
	_, otel, ok := strings.Cut(string(md), "## OpenTelemetry\n")
	require.True(t, ok)
	_, block, ok := strings.Cut(otel, "```go\n")
	require.True(t, ok, "docs/observability.md shows a setup")
	block, _, _ = strings.Cut(block, "```")
	assert.Contains(t, block, "inst.Connector(", "docs/observability.md's first setup wraps the connector")
	assert.Contains(t, block, "inst.Hooks(", "docs/observability.md's first setup installs the hooks")
}

// firstIndentedBlock is the first run of indented (code) lines in a doc comment's text.
func firstIndentedBlock(text string) string {
	var b strings.Builder
	for _, line := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(line, "\t"):
			b.WriteString(line + "\n")
		case b.Len() > 0 && line != "":
			return b.String()
		}
	}
	return b.String()
}

package kubernetes

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
)

// The API's required fields. Its OpenAPI schema is generated from the Go
// types of k8s.io/api by one rule: a field is required unless its JSON tag
// has omitempty or its comment the marker +optional, and a +required
// marker makes it required whatever the tag. Markers live in comments, so
// they are read from the types' source, which the module cache holds.

// fieldRule is what the source says of one field: +optional or +required.
type fieldRule uint8

const (
	ruleNone fieldRule = iota
	ruleOptional
	ruleRequired
)

// markers holds, by package path, "Type.jsonName" → the field's marker;
// parsed once per package.
var markers = struct {
	sync.Mutex
	pkgs map[string]map[string]fieldRule
}{pkgs: map[string]map[string]fieldRule{}}

// markersOf parses the package at import path pkg for its fields' markers.
func markersOf(pkg string) map[string]fieldRule {
	markers.Lock()
	defer markers.Unlock()
	if m, ok := markers.pkgs[pkg]; ok {
		return m
	}
	m := map[string]fieldRule{}
	markers.pkgs[pkg] = m
	out, err := exec.Command("go", "list", "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		panic(fmt.Sprintf("go list %s: %v", pkg, err))
	}
	files, err := filepath.Glob(filepath.Join(strings.TrimSpace(string(out)), "*.go"))
	if err != nil {
		panic(err)
	}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, parser.ParseComments)
		if err != nil {
			panic(fmt.Sprintf("parsing %s: %v", name, err))
		}
		ast.Inspect(f, func(n ast.Node) bool {
			ts, ok := n.(*ast.TypeSpec)
			if !ok {
				return true
			}
			if st, ok := ts.Type.(*ast.StructType); ok {
				addMarkers(m, ts.Name.Name, st)
			}
			return false
		})
	}
	return m
}

// addMarkers records the markers of struct type name's fields.
func addMarkers(m map[string]fieldRule, name string, st *ast.StructType) {
	for _, f := range st.Fields.List {
		if f.Tag == nil || f.Doc == nil {
			continue
		}
		tag, err := strconv.Unquote(f.Tag.Value)
		if err != nil {
			continue
		}
		json, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
		for _, c := range f.Doc.List {
			switch strings.TrimSpace(strings.TrimPrefix(c.Text, "//")) {
			case "+optional":
				m[name+"."+json] = ruleOptional
			case "+required", "+k8s:required":
				m[name+"."+json] = ruleRequired
			}
		}
	}
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// missingRequired lists the paths of the required fields obj's document
// raw (the same document, decoded untyped) lacks.
func missingRequired(obj any, raw any) []string {
	var out []string
	walkRequired("", raw, reflect.TypeOf(obj), &out)
	return out
}

// walkRequired walks raw along type t, adding each required field that is
// missing. A type that decodes itself (a quantity, an int-or-string, a
// time) has no fields here; a value of the wrong shape is the strict
// decoder's to report.
func walkRequired(path string, raw any, t reflect.Type, out *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		return
	}
	switch t.Kind() {
	case reflect.Struct:
		obj, ok := raw.(map[string]any)
		if !ok {
			return
		}
		rules := markersOf(t.PkgPath())
		for i := range t.NumField() {
			f := t.Field(i)
			if !f.IsExported() {
				continue
			}
			name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
				continue
			case name == "":
				walkRequired(path, obj, f.Type, out) // inline: the same object
				continue
			}
			v, present := obj[name]
			if present {
				walkRequired(path+"."+name, v, f.Type, out)
				continue
			}
			rule := rules[t.Name()+"."+name]
			omitempty := strings.Contains(","+opts+",", ",omitempty,")
			if rule == ruleRequired || (!omitempty && rule != ruleOptional) {
				*out = append(*out, strings.TrimPrefix(path+"."+name, "."))
			}
		}
	case reflect.Slice:
		items, _ := raw.([]any)
		for i, it := range items {
			walkRequired(fmt.Sprintf("%s[%d]", path, i), it, t.Elem(), out)
		}
	case reflect.Map:
		obj, _ := raw.(map[string]any)
		for k, v := range obj {
			walkRequired(path+"."+k, v, t.Elem(), out)
		}
	}
}

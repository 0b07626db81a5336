package monitoring

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Check parses each expression with Prometheus' parser and holds it to
// what nodes export (the package's doc says how); it returns every problem,
// each with where its expression is.
func Check(exprs []Expression, e Exported) []string {
	p := parser.NewParser(parser.Options{})
	var out []string
	for _, x := range exprs {
		expr, err := p.ParseExpr(x.Query)
		if err != nil {
			out = append(out, fmt.Sprintf("%s: %v", x.Where, err))
			continue
		}
		c := checker{e: e}
		c.walk(expr)
		c.need(x.Uses, expr, "read by its legend or annotations")
		for _, problem := range c.problems {
			out = append(out, x.Where+": "+problem)
		}
	}
	return out
}

// checker checks one expression against e.
type checker struct {
	e        Exported
	problems []string
}

func (c *checker) add(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

func (c *checker) walk(expr parser.Expr) {
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		switch n := n.(type) {
		case *parser.VectorSelector:
			c.selector(n)
		case *parser.Call:
			c.call(n)
		case *parser.AggregateExpr:
			if !n.Without {
				c.need(n.Grouping, n.Expr, fmt.Sprintf("%s by (%s)", n.Op, strings.Join(n.Grouping, ", ")))
			}
		case *parser.BinaryExpr:
			c.matching(n)
		}
		return nil
	})
}

// need checks that every label of names, which what names, is one of the
// labels of of's result.
func (c *checker) need(names []string, of parser.Expr, what string) {
	have := c.labelsOf(of)
	for _, l := range names {
		if !have[l] {
			c.add("%s: %s has no label %s (it has %s)", what, of, l, list(have))
		}
	}
}

// selector checks that vs names a series nodes export, with its labels
// and values.
func (c *checker) selector(vs *parser.VectorSelector) {
	if vs.Name == "" {
		c.add("%s selects by no metric name", vs)
		return
	}
	s, ok := c.e.series(vs.Name)
	if !ok {
		c.add("%s: no node exports %s", vs, vs.Name)
		return
	}
	for _, m := range vs.LabelMatchers {
		if m.Name == model.MetricNameLabel || targetLabels[m.Name] {
			continue
		}
		values, ok := s.Labels[m.Name]
		if !ok {
			c.add("%s: %s has no label %s (it has %s)", vs, vs.Name, m.Name, list(s.Labels))
			continue
		}
		c.values(vs, m, values)
	}
}

// values checks that each value m names is one some node exported: a typo
// in a value, even a negated one, would select silently what it should
// not. A regular expression other than literals joined by | must match
// one.
func (c *checker) values(vs *parser.VectorSelector, m *labels.Matcher, values map[string]bool) {
	named := []string{m.Value}
	if m.Type == labels.MatchRegexp || m.Type == labels.MatchNotRegexp {
		named = strings.Split(m.Value, "|")
		for _, v := range named {
			if regexp.QuoteMeta(v) != v {
				if m.Type == labels.MatchRegexp && !slices.ContainsFunc(slices.Collect(maps.Keys(values)), m.Matches) {
					c.add("%s: %s matches no value of %s (%s)", vs, m, m.Name, list(values))
				}
				return
			}
		}
	}
	for _, v := range named {
		if v != "" && !values[v] {
			c.add("%s: no node exports %s=%q (%s has %s)", vs, m.Name, v, m.Name, list(values))
		}
	}
}

// counterFuncs read counters, gaugeFuncs gauges.
var (
	counterFuncs = map[string]bool{"rate": true, "irate": true, "increase": true, "resets": true}
	gaugeFuncs   = map[string]bool{"deriv": true, "delta": true, "idelta": true, "predict_linear": true,
		"double_exponential_smoothing": true}
)

// call checks that histogram_quantile reads buckets (by le), and a counter
// or gauge function a series of its kind.
func (c *checker) call(n *parser.Call) {
	name := n.Func.Name
	if name == "histogram_quantile" {
		c.need([]string{"le"}, n.Args[1], name)
	}
	if !counterFuncs[name] && !gaugeFuncs[name] {
		return
	}
	m, ok := n.Args[0].(*parser.MatrixSelector)
	if !ok {
		return
	}
	vs := m.VectorSelector.(*parser.VectorSelector)
	if s, ok := c.e.series(vs.Name); ok && s.Counter != counterFuncs[name] {
		kind := map[bool]string{true: "a counter", false: "a gauge"}
		c.add("%s of %s, %s: %s reads %s", name, vs.Name, kind[s.Counter], name, kind[counterFuncs[name]])
	}
}

// matching checks that the labels a vector matching names are on the
// sides it takes them from.
func (c *checker) matching(n *parser.BinaryExpr) {
	vm := n.VectorMatching
	if vm == nil || n.LHS.Type() != parser.ValueTypeVector || n.RHS.Type() != parser.ValueTypeVector {
		return
	}
	if vm.On {
		c.need(vm.MatchingLabels, n.LHS, "on ("+strings.Join(vm.MatchingLabels, ", ")+")")
		c.need(vm.MatchingLabels, n.RHS, "on ("+strings.Join(vm.MatchingLabels, ", ")+")")
	}
	switch vm.Card {
	case parser.CardManyToOne:
		c.need(vm.Include, n.RHS, "group_left ("+strings.Join(vm.Include, ", ")+")")
	case parser.CardOneToMany:
		c.need(vm.Include, n.LHS, "group_right ("+strings.Join(vm.Include, ", ")+")")
	}
}

// labelsOf are the label names the series of x's result may have, as
// Prometheus computes them: a selector's, its target's (job, instance),
// what an aggregation keeps, what a vector matching keeps and copies.
func (c *checker) labelsOf(x parser.Expr) map[string]bool {
	switch x := x.(type) {
	case *parser.VectorSelector:
		out := maps.Clone(targetLabels)
		if s, ok := c.e.series(x.Name); ok {
			for l := range s.Labels {
				out[l] = true
			}
		}
		return out
	case *parser.MatrixSelector:
		return c.labelsOf(x.VectorSelector)
	case *parser.SubqueryExpr:
		return c.labelsOf(x.Expr)
	case *parser.ParenExpr:
		return c.labelsOf(x.Expr)
	case *parser.UnaryExpr:
		return c.labelsOf(x.Expr)
	case *parser.StepInvariantExpr:
		return c.labelsOf(x.Expr)
	case *parser.AggregateExpr:
		return c.aggregated(x)
	case *parser.Call:
		return c.called(x)
	case *parser.BinaryExpr:
		return c.combined(x)
	}
	return map[string]bool{} // a number or a string
}

func (c *checker) aggregated(x *parser.AggregateExpr) map[string]bool {
	switch {
	case x.Without:
		out := c.labelsOf(x.Expr)
		for _, l := range x.Grouping {
			delete(out, l)
		}
		return out
	case x.Op == parser.TOPK || x.Op == parser.BOTTOMK || x.Op == parser.LIMITK || x.Op == parser.LIMIT_RATIO:
		return c.labelsOf(x.Expr) // a selection of the series, whole
	}
	out := set(x.Grouping)
	if s, ok := x.Param.(*parser.StringLiteral); ok && x.Op == parser.COUNT_VALUES {
		out[s.Val] = true
	}
	return out
}

func (c *checker) called(x *parser.Call) map[string]bool {
	switch x.Func.Name {
	case "histogram_quantile":
		out := c.labelsOf(x.Args[1])
		delete(out, "le")
		return out
	case "absent", "absent_over_time":
		out := map[string]bool{}
		parser.Inspect(x.Args[0], func(n parser.Node, _ []parser.Node) error {
			if vs, ok := n.(*parser.VectorSelector); ok {
				for _, m := range vs.LabelMatchers {
					if m.Type == labels.MatchEqual && m.Name != model.MetricNameLabel {
						out[m.Name] = true
					}
				}
			}
			return nil
		})
		return out
	case "label_replace", "label_join":
		out := c.labelsOf(x.Args[0])
		out[x.Args[1].(*parser.StringLiteral).Val] = true
		return out
	}
	for _, a := range x.Args {
		if t := a.Type(); t == parser.ValueTypeVector || t == parser.ValueTypeMatrix {
			return c.labelsOf(a)
		}
	}
	return map[string]bool{}
}

func (c *checker) combined(x *parser.BinaryExpr) map[string]bool {
	lhs, rhs := x.LHS.Type() == parser.ValueTypeVector, x.RHS.Type() == parser.ValueTypeVector
	switch {
	case !lhs && !rhs:
		return map[string]bool{}
	case !rhs:
		return c.labelsOf(x.LHS)
	case !lhs:
		return c.labelsOf(x.RHS)
	case x.Op == parser.LAND || x.Op == parser.LUNLESS:
		return c.labelsOf(x.LHS)
	case x.Op == parser.LOR:
		out := c.labelsOf(x.LHS)
		maps.Copy(out, c.labelsOf(x.RHS))
		return out
	}
	vm := x.VectorMatching
	switch vm.Card {
	case parser.CardManyToOne:
		out := c.labelsOf(x.LHS)
		maps.Copy(out, set(vm.Include))
		return out
	case parser.CardOneToMany:
		out := c.labelsOf(x.RHS)
		maps.Copy(out, set(vm.Include))
		return out
	}
	out := c.labelsOf(x.LHS)
	for l := range out {
		if slices.Contains(vm.MatchingLabels, l) != vm.On {
			delete(out, l)
		}
	}
	return out
}

func set(names []string) map[string]bool {
	out := map[string]bool{}
	for _, n := range names {
		out[n] = true
	}
	return out
}

// list is a set's keys, sorted, for a message.
func list[V any](s map[string]V) string {
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(slices.Sorted(maps.Keys(s)), ", ")
}

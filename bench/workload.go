package bench

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
)

// Bounds of a workload.
const (
	// PromptsMax bounds the prompts of a JSONL file.
	PromptsMax = 1 << 16
	// ShapesMax bounds the distinct requests of a run: each is checked
	// against the reference engine once.
	ShapesMax = 1 << 14
	// TenantsMax bounds the tenants requests are spread over.
	TenantsMax = 1024
)

// Prompt is one line of a prompts file: {"prompt": "…", "max_tokens": N}.
// MaxTokens zero means the workload's output distribution decides.
type Prompt struct {
	Text      string `json:"prompt"`
	MaxTokens int    `json:"max_tokens,omitempty"`
}

// ParsePrompts reads a JSONL file of prompts, one object a line (blank
// lines skipped), at most PromptsMax, each max_tokens 0 to LengthMax.
func ParsePrompts(data []byte) ([]Prompt, error) {
	var out []Prompt
	for i, line := range bytes.Split(data, []byte("\n")) {
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		var p Prompt
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			return nil, &SpecError{Spec: "line " + strconv.Itoa(i+1), Reason: err.Error()}
		}
		if p.MaxTokens < 0 || p.MaxTokens > LengthMax {
			return nil, &RangeError{What: fmt.Sprintf("max_tokens of line %d", i+1), Value: float64(p.MaxTokens), Max: LengthMax}
		}
		if len(out) == PromptsMax {
			return nil, &RangeError{What: "prompts in the file", Value: PromptsMax + 1, Min: 1, Max: PromptsMax}
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, &SpecError{Spec: "prompts file", Reason: "holds no prompt"}
	}
	return out, nil
}

// Workload is what a benchmark sends: Shapes distinct requests, each a
// prompt (of PromptBytes bytes of text, or one of Prompts) and a most
// tokens to generate (OutputTokens, unless the prompt says), spread over
// Tenants tenants.
type Workload struct {
	// PromptBytes is the length of a generated prompt in bytes of ASCII
	// text (with a byte tokenizer, one token each, after the BOS).
	PromptBytes Dist
	// OutputTokens is the most tokens each request asks for.
	OutputTokens Dist
	// Prompts, when not empty, are the prompts, drawn in seeded order;
	// PromptBytes is then unused.
	Prompts []Prompt
	// Tenants is how many tenants ("tenant-0" …) the requests go round.
	Tenants int
	// Distinct is how many distinct requests there are; a run sends them
	// over and over in an order drawn from Seed.
	Distinct int
	// Seed draws the shapes and their order.
	Seed uint64
}

// Validate refuses a workload that could not be built.
func (w Workload) Validate() error {
	if len(w.Prompts) == 0 {
		if err := w.PromptBytes.Validate(); err != nil {
			return err
		}
	}
	if err := w.OutputTokens.Validate(); err != nil {
		return err
	}
	for _, f := range []struct {
		what      string
		v, lo, hi int
	}{{"tenants", w.Tenants, 1, TenantsMax}, {"distinct requests", w.Distinct, 1, ShapesMax}} {
		if f.v < f.lo || f.v > f.hi {
			return &RangeError{What: f.what, Value: float64(f.v), Min: float64(f.lo), Max: float64(f.hi)}
		}
	}
	return nil
}

// Shape is one distinct request of a workload.
type Shape struct {
	Prompt    string
	MaxTokens int
}

// Request is one request of a run: its shape and its tenant's index
// (named by TenantName).
type Request struct {
	Shape, Tenant int
}

// Shapes are the workload's distinct requests, the same for the same
// workload: with a prompts file, Distinct of its prompts drawn without
// repeat (all of them, in drawn order, if it holds fewer); otherwise
// generated prompts of PromptBytes bytes.
func (w Workload) Shapes() []Shape {
	r := rand.New(rand.NewPCG(w.Seed, streamShapes))
	n := w.Distinct
	if len(w.Prompts) > 0 {
		n = min(n, len(w.Prompts))
	}
	order := r.Perm(max(len(w.Prompts), 1))
	out := make([]Shape, n)
	for i := range out {
		var s Shape
		if len(w.Prompts) > 0 {
			p := w.Prompts[order[i]]
			s = Shape{Prompt: p.Text, MaxTokens: p.MaxTokens}
		} else {
			s.Prompt = Text(r, w.PromptBytes.Draw(r))
		}
		if s.MaxTokens == 0 {
			s.MaxTokens = w.OutputTokens.Draw(r)
		}
		out[i] = s
	}
	return out
}

// Draw is the n requests of a run, in the order they are sent: each a
// shape drawn from Seed, tenants taken in turn.
func (w Workload) Draw(shapes, n int) []Request {
	r := rand.New(rand.NewPCG(w.Seed, streamOrder))
	out := make([]Request, n)
	for i := range out {
		out[i] = Request{Shape: r.IntN(shapes), Tenant: i % w.Tenants}
	}
	return out
}

// TenantName is the name of the i-th tenant of a workload.
func TenantName(i int) string { return "tenant-" + strconv.Itoa(i) }

// The streams of a seed: one for each thing drawn from it, so that a change
// to one (more requests, another rate) leaves the others as they were.
const (
	streamShapes uint64 = iota + 1
	streamOrder
	streamArrivals
)

// words are what generated prompts are made of: ASCII, so that bytes are
// tokens under a byte tokenizer and a cut never splits a character.
var words = strings.Fields(`the a cache page node decode prefill token tenant request answer
router model batch queue pool memory transfer reply story once upon time little girl
dog sun tree house happy played found big red blue went saw day`)

// Text is n bytes of words drawn from r, separated by spaces.
func Text(r *rand.Rand, n int) string {
	var b strings.Builder
	b.Grow(n + 16)
	for b.Len() < n {
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[r.IntN(len(words))])
	}
	return b.String()[:n]
}

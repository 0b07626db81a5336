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
	// PrefixBytesMax bounds a shared prefix: a few times any built-in
	// model's context, in bytes of text.
	PrefixBytesMax = 1 << 14
	// TurnsMax bounds the turns of a chat.
	TurnsMax = 64
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
// Tenants tenants. Generated prompts may start with a shared prefix
// (PrefixBytes) and be chats of several turns (Turns): the traffic a
// prefix cache serves.
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
	// PrefixBytes, when positive, starts every generated prompt with one
	// of Prefixes common prefixes of that many bytes (a system prompt, a
	// few examples); PromptBytes is then the length of what follows it.
	PrefixBytes, Prefixes int
	// PrefixAcrossTenants gives every tenant the same prefixes. Otherwise
	// each tenant has its own, shared only among its requests, as a
	// tenant's own system prompt would be.
	PrefixAcrossTenants bool
	// Turns, above 1, makes each distinct request a chat of that many
	// turns: each turn sends the whole conversation so far (the prompts
	// and answers of the turns before it) and a new user message of
	// PromptBytes bytes, so that a turn's prompt starts with the last
	// one's.
	Turns int
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
	fields := []struct {
		what      string
		v, lo, hi int
	}{{"tenants", w.Tenants, 1, TenantsMax}, {"turns", w.turns(), 1, TurnsMax},
		{"distinct requests (turns of every chat)", w.Distinct * w.turns(), 1, ShapesMax}, {"shared prefix bytes", w.PrefixBytes, 0, PrefixBytesMax}}
	if w.PrefixBytes > 0 {
		fields = append(fields, struct {
			what      string
			v, lo, hi int
		}{"shared prefixes", w.Prefixes, 1, ShapesMax})
	}
	for _, f := range fields {
		if f.v < f.lo || f.v > f.hi {
			return &RangeError{What: f.what, Value: float64(f.v), Min: float64(f.lo), Max: float64(f.hi)}
		}
	}
	if len(w.Prompts) > 0 && (w.PrefixBytes > 0 || w.turns() > 1) {
		return &SpecError{Spec: "prompts file", Reason: "shared prefixes and chats are drawn, not read: give a prompts file or them"}
	}
	return nil
}

// turns is how many turns each distinct request is: 1 unless a chat.
func (w Workload) turns() int { return max(w.Turns, 1) }

// Bound says whether each shape belongs to one tenant (Shape.Tenant):
// a prefix of its own or a chat's history is cached in its tenant's
// scope only, so that a shape sent as another tenant would miss.
func (w Workload) Bound() bool { return w.PrefixBytes > 0 || w.turns() > 1 }

// Shape is one distinct request of a workload.
type Shape struct {
	Prompt    string
	MaxTokens int
	// Tenant is the tenant it is sent as, when the workload is Bound.
	Tenant int
	// Turn is its turn in a chat: 0 for the first, or a request that is no
	// chat. A later turn follows the shape before it: the prompt it sends
	// is that shape's prompt and answer, then Prompt (the new message).
	Turn int
}

// Request is one request of a run: its shape and its tenant's index
// (named by TenantName).
type Request struct {
	Shape, Tenant int
}

// Shapes are the workload's distinct requests, the same for the same
// workload: with a prompts file, Distinct of its prompts drawn without
// repeat (all of them, in drawn order, if it holds fewer); otherwise
// generated prompts of PromptBytes bytes. A chat's Turns shapes are
// consecutive, its first turn first. In a Bound workload, conversation i
// belongs to tenant i mod Tenants and starts with that tenant's prefix
// number i / Tenants mod Prefixes (or prefix i mod Prefixes, the same for
// every tenant, with PrefixAcrossTenants), so that every prefix is used.
func (w Workload) Shapes() []Shape {
	r := rand.New(rand.NewPCG(w.Seed, streamShapes))
	n := w.Distinct
	if len(w.Prompts) > 0 {
		n = min(n, len(w.Prompts))
	}
	order := r.Perm(max(len(w.Prompts), 1))
	turns := w.turns()
	prefixes := map[[2]int]string{}
	out := make([]Shape, 0, n*turns)
	for i := range n {
		for turn := range turns {
			s := Shape{Turn: turn}
			if w.Bound() {
				s.Tenant = i % w.Tenants
			}
			switch {
			case len(w.Prompts) > 0:
				p := w.Prompts[order[i]]
				s.Prompt, s.MaxTokens = p.Text, p.MaxTokens
			case turn > 0:
				s.Prompt = "\n" + Text(r, w.PromptBytes.Draw(r))
			default:
				s.Prompt = w.prefix(prefixes, i) + Text(r, w.PromptBytes.Draw(r))
			}
			if s.MaxTokens == 0 {
				s.MaxTokens = w.OutputTokens.Draw(r)
			}
			out = append(out, s)
		}
	}
	return out
}

// prefix is the shared prefix conversation i starts with (none without
// PrefixBytes), drawn once for each tenant (or once for all) and number
// into made, from a stream of its own: the same prefix whatever else
// changes.
func (w Workload) prefix(made map[[2]int]string, i int) string {
	if w.PrefixBytes == 0 {
		return ""
	}
	key := [2]int{i % w.Tenants, i / w.Tenants % w.Prefixes}
	if w.PrefixAcrossTenants {
		key = [2]int{0, i % w.Prefixes}
	}
	if p, ok := made[key]; ok {
		return p
	}
	// A stream per prefix: tenants below 2^12 and prefixes below 2^20.
	r := rand.New(rand.NewPCG(w.Seed, streamPrefixes<<32|uint64(key[0])<<20|uint64(key[1])))
	made[key] = Text(r, w.PrefixBytes)
	return made[key]
}

// Draw is the n requests of a run, in the order they are sent: each a
// shape drawn from Seed, tenants taken in turn. In a Bound workload each
// is the first turn of a conversation, sent as the tenant it belongs to;
// its later turns follow it.
func (w Workload) Draw(shapes []Shape, n int) []Request {
	r := rand.New(rand.NewPCG(w.Seed, streamOrder))
	turns := w.turns()
	out := make([]Request, n)
	for i := range out {
		if w.Bound() {
			first := r.IntN(len(shapes)/turns) * turns
			out[i] = Request{Shape: first, Tenant: shapes[first].Tenant}
			continue
		}
		out[i] = Request{Shape: r.IntN(len(shapes)), Tenant: i % w.Tenants}
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
	streamPrefixes
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

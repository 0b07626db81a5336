package main

import (
	"fmt"
	"runtime"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/kvwarden/kvwarden/bench"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/boundedread"
	"github.com/kvwarden/kvwarden/kv"
)

// promptsFileBytesMax bounds the prompts file read: PromptsMax prompts of
// a few kilobytes each.
const promptsFileBytesMax = 256 << 20

// workloadFlags are the flags "node bench" and "node plan" share: the
// model the cluster serves (for the reference answers and the tokens), the
// requests, the send times and the objectives.
type workloadFlags struct {
	Model     string        `json:"model,omitempty"`
	Tokenizer string        `json:"tokenizer,omitempty"`
	DType     string        `json:"dtype"`
	PromptLen string        `json:"prompt_len"`
	OutputLen string        `json:"output_len"`
	Prompts   string        `json:"prompts,omitempty"`
	Distinct  int           `json:"distinct"`
	Tenants   int           `json:"tenants"`
	Seed      uint64        `json:"seed"`
	Rate      float64       `json:"rate_per_s"`
	Warmup    time.Duration `json:"warmup_ns"`
	Duration  time.Duration `json:"duration_ns"`
	Requests  int           `json:"requests"`
	SLOTTFT   time.Duration `json:"slo_ttft_ns"`
	SLOITL    time.Duration `json:"slo_itl_ns"`
	// The traffic a prefix cache serves (bench's flags only: node plan's
	// model has no cache).
	PrefixLen           int  `json:"shared_prefix_len,omitempty"`
	Prefixes            int  `json:"shared_prefixes,omitempty"`
	PrefixAcrossTenants bool `json:"prefix_across_tenants,omitempty"`
	Turns               int  `json:"turns,omitempty"`
}

func defaultWorkloadFlags() workloadFlags {
	return workloadFlags{DType: kv.F32.String(), PromptLen: "uniform:16:128", OutputLen: "uniform:16:128", Distinct: 64, Tenants: 1,
		Seed: 1, Rate: 2, Warmup: 2 * time.Second, Duration: 20 * time.Second, Prefixes: 1, Turns: 1}
}

func (f *workloadFlags) bind(fs *pflag.FlagSet) {
	fs.StringVar(&f.Model, "model", f.Model, "the cluster's "+modelFlagHelp+" (for the reference answers)")
	fs.StringVar(&f.Tokenizer, "tokenizer", f.Tokenizer, tokenizerFlagHelp)
	fs.StringVar(&f.DType, "dtype", f.DType, "K and V type the nodes run (f32, f16, bf16): the reference computes the same")
	fs.StringVar(&f.PromptLen, "prompt-len", f.PromptLen, "prompt length in bytes of text (the built-in model's tokens: one a byte): N or uniform:MIN:MAX")
	fs.StringVar(&f.OutputLen, "output-len", f.OutputLen, "most tokens each request asks for: N or uniform:MIN:MAX")
	fs.StringVar(&f.Prompts, "prompts", f.Prompts, "JSONL file of prompts, one {\"prompt\": …, \"max_tokens\": N} a line, in place of --prompt-len")
	fs.IntVar(&f.Distinct, "distinct", f.Distinct, "distinct requests, each checked against the reference engine; a run sends them over and over")
	fs.IntVar(&f.Tenants, "tenants", f.Tenants, "tenants the requests go round (tenant-0, tenant-1, …)")
	fs.Uint64Var(&f.Seed, "seed", f.Seed, "seed of the requests and of the send times")
	fs.Float64Var(&f.Rate, "rate", f.Rate, "requests a second, Poisson arrivals")
	fs.DurationVar(&f.Warmup, "warmup", f.Warmup, "requests sent this long from the start are not counted")
	fs.DurationVar(&f.Duration, "duration", f.Duration, "how long to send after the warm-up (0: no bound by time)")
	fs.IntVar(&f.Requests, "requests", f.Requests, "how many requests to send after the warm-up (0: no bound by count)")
	fs.DurationVar(&f.SLOTTFT, "slo-ttft", f.SLOTTFT, "goodput counts requests whose first token came within this (0: no bound)")
	fs.DurationVar(&f.SLOITL, "slo-itl", f.SLOITL, "goodput counts requests whose mean inter-token latency is within this (0: no bound)")
}

// bindCache adds the flags of the traffic a prefix cache serves.
func (f *workloadFlags) bindCache(fs *pflag.FlagSet) {
	fs.IntVar(&f.PrefixLen, "shared-prefix-len", f.PrefixLen, "start every prompt with one of --shared-prefixes common prefixes of this many bytes, --prompt-len then being what follows (0: none)")
	fs.IntVar(&f.Prefixes, "shared-prefixes", f.Prefixes, "how many shared prefixes each tenant has (all tenants together, with --prefix-across-tenants)")
	fs.BoolVar(&f.PrefixAcrossTenants, "prefix-across-tenants", f.PrefixAcrossTenants, "give every tenant the same prefixes (a cache shares them only within a scope)")
	fs.IntVar(&f.Turns, "turns", f.Turns, "make each distinct request a chat of this many turns, each resending the conversation so far and a new message of --prompt-len; a request of the schedule is then a whole chat")
}

// workload is the run's model, requests and their reference answers.
type workload struct {
	model  *engine.Model
	w      bench.Workload
	shapes []bench.Shape
	refs   []reference
	order  []bench.Request
	slo    bench.SLO
	bound  bench.Bound
}

// check validates the flags that need no file.
func (f workloadFlags) check() (bench.Workload, error) {
	var w bench.Workload
	var err error
	if w.OutputTokens, err = bench.ParseDist(f.OutputLen); err != nil {
		return w, fmt.Errorf("--output-len: %w", err)
	}
	// --prompt-len is parsed even with --prompts, which makes it unused:
	// the prompts are read only once the flags pass, and a workload
	// without prompts must have a valid prompt length to pass Validate.
	if w.PromptBytes, err = bench.ParseDist(f.PromptLen); err != nil {
		return w, fmt.Errorf("--prompt-len: %w", err)
	}
	w.Tenants, w.Distinct, w.Seed = f.Tenants, f.Distinct, f.Seed
	w.PrefixBytes, w.Prefixes, w.PrefixAcrossTenants, w.Turns = f.PrefixLen, f.Prefixes, f.PrefixAcrossTenants, f.Turns
	if err := w.Validate(); err != nil {
		return w, err
	}
	if f.SLOTTFT < 0 || f.SLOITL < 0 || f.Warmup < 0 {
		return w, fmt.Errorf("--slo-ttft (%s), --slo-itl (%s) and --warmup (%s) must not be negative", f.SLOTTFT, f.SLOITL, f.Warmup)
	}
	return w, f.bound().Validate()
}

func (f workloadFlags) bound() bench.Bound {
	return bench.Bound{Duration: f.Duration, Requests: f.Requests}
}

// build loads the model and the prompts, draws the requests and computes
// every distinct request's reference answer (on every processor), each
// checked to fit the model's context.
func (f workloadFlags) build() (*workload, error) {
	w, err := f.check()
	if err != nil {
		return nil, usageError{err}
	}
	if f.Prompts != "" {
		data, err := boundedread.File(f.Prompts, promptsFileBytesMax)
		if err != nil {
			return nil, usageError{fmt.Errorf("--prompts: %w", err)}
		}
		if w.Prompts, err = bench.ParsePrompts(data); err != nil {
			return nil, usageError{fmt.Errorf("--prompts %s: %w", f.Prompts, err)}
		}
	}
	m, err := nodeConfig{Model: f.Model, Tokenizer: f.Tokenizer, DType: f.DType}.model()
	if err != nil {
		return nil, err
	}
	out := &workload{model: m, w: w, shapes: w.Shapes(), slo: bench.SLO{TTFT: f.SLOTTFT, ITL: f.SLOITL}, bound: f.bound()}
	out.order = w.Draw(out.shapes, benchOrderLen)
	out.refs, err = references(m, out.shapes)
	return out, err
}

// references are the reference engine's answers to shapes, computed on
// every processor at once, a chat's turns one after the other: each later
// turn's prompt is set to the one before it, that turn's answer (as JSON
// carries it, as a client would send it back) and its own message.
func references(m *engine.Model, shapes []bench.Shape) ([]reference, error) {
	refs := make([]reference, len(shapes))
	errs := make([]error, len(shapes))
	ctxTokens := m.Config().ContextTokens
	var wg sync.WaitGroup
	next := make(chan int)
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for first := range next {
				for i := first; i < len(shapes) && (i == first || shapes[i].Turn > 0); i++ {
					if i > first {
						shapes[i].Prompt = shapes[i-1].Prompt + refs[i-1].jsonText + shapes[i].Prompt
					}
					if refs[i], errs[i] = reference1(m, i, shapes[i], ctxTokens); errs[i] != nil {
						break
					}
				}
			}
		}()
	}
	for i, s := range shapes {
		if s.Turn == 0 {
			next <- i
		}
	}
	close(next)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return refs, nil
}

// reference1 is the reference answer to shape i.
func reference1(m *engine.Model, i int, s bench.Shape, ctxTokens int) (reference, error) {
	prompt := len(m.Tokenizer().Encode(s.Prompt))
	if prompt+s.MaxTokens > ctxTokens {
		return reference{}, usageError{&bench.RangeError{What: fmt.Sprintf("request %d's prompt (%d tokens) and most tokens (%d)", i, prompt, s.MaxTokens),
			Value: float64(prompt + s.MaxTokens), Min: 2, Max: float64(ctxTokens)}}
	}
	tokens, err := m.Answer(s.Prompt, s.MaxTokens)
	return newReference(tokens, m.Text(s.Prompt, tokens), prompt), err
}

package live

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/messages"
)

// Outcome is what one request came to, as the client saw it.
type Outcome struct {
	Request Request
	// Start and End are since the campaign's start: when the request was
	// sent and when its answer or error came.
	Start, End time.Duration
	// Streamed are the tokens streamed, in order.
	Streamed []int
	// Answer is the final answer's tokens when the node answered.
	Answer []int
	// Err is the request's error: a *messages.WireError from the node,
	// a context error once cancelled, or the client's own.
	Err error
	// Cancelled: the client cancelled the request (it streamed
	// Request.CancelAfter tokens).
	Cancelled bool
	// CachedTokens is how many prompt tokens the answer says prefill
	// read from its prefix cache.
	CachedTokens int
}

// Class is what the checker makes of an outcome.
type Class uint8

const (
	// Correct: the answer is the reference's, and so is every token
	// streamed.
	Correct Class = iota
	// Refused: an oversize prompt refused with prompt_too_long, nothing
	// streamed.
	Refused
	// CleanError: an error with a stable code, every token streamed
	// before it the reference's.
	CleanError
	// Cancelled: cancelled by the client, every token streamed the
	// reference's.
	Cancelled
	// Wrong: an answer or a streamed token that is not the reference's,
	// or an oversize prompt answered.
	Wrong
	classes
)

var classNames = [classes]string{"correct", "refused", "clean_error", "cancelled", "wrong"}

func (c Class) String() string {
	if c < classes {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// MarshalText spells a class by its name, in reports.
func (c Class) MarshalText() ([]byte, error) { return []byte(c.String()), nil }

// Codes of errors without a wire code.
const (
	// CodeCancelled is a request the client cancelled.
	CodeCancelled = "cancelled"
	// CodeClient is an error of the client itself, before or after the
	// node (no node's code).
	CodeClient = "client_error"
)

// Verdict is the checker's word on one outcome.
type Verdict struct {
	Class Class
	// Code is the error's stable name (messages.ErrorCode's, or
	// CodeCancelled, CodeClient); "" for an answer.
	Code string
	// CrossTenant: the wrong tokens are another tenant's reference (or
	// its first tokens); CrossRequest: those of another prompt of the
	// same tenant. Owner is the tenant whose they are.
	CrossTenant, CrossRequest bool
	Owner                     string
	// Bytes is the length of the wrong tokens' text.
	Bytes int
	// StreamGap: a correct answer whose stream brought fewer of its
	// tokens (none wrong).
	StreamGap bool
	// Why says, for a wrong outcome, what differed.
	Why string
}

// Checker compares outcomes with the reference engine. References are
// computed once per distinct prompt, with every token a request may ask
// for; a request's reference is its first MaxTokens, ended at the first
// stop token as engine.Model.Answer ends it. It is safe for concurrent
// use.
type Checker struct {
	model *engine.Model
	w     *Workload
	ready chan struct{}
	err   error
	refs  [][][]int // by tenant, then prompt
}

// NewChecker starts computing the workload's references of model on
// workers goroutines; Check waits for them.
func NewChecker(model *engine.Model, w *Workload, workers int) *Checker {
	c := &Checker{model: model, w: w, ready: make(chan struct{})}
	go func() {
		defer close(c.ready)
		c.err = c.compute(max(workers, 1))
	}()
	return c
}

func (c *Checker) compute(workers int) error {
	cfg := c.w.Config()
	c.refs = make([][][]int, cfg.Tenants)
	type job struct{ t, j int }
	jobs := make(chan job)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for jb := range jobs {
				ref, err := c.model.Reference(c.w.Prompt(jb.t, jb.j), cfg.MaxTokensMax)
				if err != nil && errs[i] == nil {
					errs[i] = fmt.Errorf("live: reference of tenant %d's prompt %d: %w", jb.t, jb.j, err)
				}
				c.refs[jb.t][jb.j] = ref
			}
		})
	}
	for t := range cfg.Tenants {
		c.refs[t] = make([][]int, cfg.PromptsPerTenant)
		for j := range cfg.PromptsPerTenant {
			jobs <- job{t, j}
		}
	}
	close(jobs)
	wg.Wait()
	return errors.Join(errs...)
}

// Wait blocks until the references are computed and returns the error
// that stopped them, if any.
func (c *Checker) Wait(ctx context.Context) error {
	select {
	case <-c.ready:
		return c.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Reference is the answer of tenant t's prompt j with at most maxTokens.
func (c *Checker) Reference(t, j, maxTokens int) []int {
	<-c.ready
	return c.answerOf(c.refs[t][j], maxTokens)
}

// answerOf is the answer of at most n tokens that a reference of more
// gives: its first n, ended at the first stop token, as
// engine.Model.Answer ends them.
func (c *Checker) answerOf(ref []int, n int) []int {
	out := ref[:min(n, len(ref))]
	if i := slices.Index(out, c.model.Tokenizer().Stop()); i >= 0 {
		out = out[:i+1]
	}
	return out
}

// Check classifies o. It waits for the references.
func (c *Checker) Check(o Outcome) Verdict {
	<-c.ready
	r := o.Request
	var want []int
	if !r.Oversize {
		want = c.Reference(tenantIndex(r.Tenant), r.Prompt, r.MaxTokens)
	}
	if i := divergence(o.Streamed, want); i >= 0 {
		return c.wrong(o, o.Streamed, fmt.Sprintf("streamed token %d is %s, the reference's %s", i, tokenAt(o.Streamed, i),
			tokenAt(want, i)))
	}
	if o.Err == nil {
		switch {
		case r.Oversize:
			return c.wrong(o, o.Answer, fmt.Sprintf("a prompt of %d tokens with %d to generate exceeds the window and was answered",
				len(r.Text), r.MaxTokens))
		case !slices.Equal(o.Answer, want):
			return c.wrong(o, o.Answer, fmt.Sprintf("answered %d tokens, the reference is %d; first difference at %d",
				len(o.Answer), len(want), max(divergence(o.Answer, want), min(len(o.Answer), len(want)))))
		}
		// Every token streamed is the reference's (checked above); a
		// stream that lost some (a chunk lost with its connection, and
		// the client refusing those after it) delivered no wrong byte.
		return Verdict{Class: Correct, StreamGap: !o.Cancelled && len(o.Streamed) < len(o.Answer)}
	}
	if o.Cancelled && errors.Is(o.Err, context.Canceled) {
		return Verdict{Class: Cancelled, Code: CodeCancelled}
	}
	code := CodeOf(o.Err)
	if r.Oversize && code == messages.CodePromptTooLong.String() {
		return Verdict{Class: Refused, Code: code}
	}
	return Verdict{Class: CleanError, Code: code}
}

// CodeOf is the stable name of err's code.
func CodeOf(err error) string {
	var we *messages.WireError
	switch {
	case errors.As(err, &we) && we != nil:
		return we.Code.String()
	case errors.Is(err, context.Canceled):
		return CodeCancelled
	}
	return CodeClient
}

// divergence is the first index at which got is not a prefix of want, or
// -1 when it is one.
func divergence(got, want []int) int {
	for i, tok := range got {
		if i >= len(want) || tok != want[i] {
			return i
		}
	}
	return -1
}

func tokenAt(tokens []int, i int) string {
	if i < len(tokens) {
		return fmt.Sprint(tokens[i])
	}
	return "none"
}

// wrong is a wrong verdict on o, with whose reference the tokens got are,
// if any prompt's but o's own: first another prompt of the same tenant,
// then another tenant's.
func (c *Checker) wrong(o Outcome, got []int, why string) Verdict {
	v := Verdict{Class: Wrong, Why: why, Bytes: len(engine.DecodeText(c.model.Tokenizer(), -1, got))}
	if len(got) == 0 {
		return v
	}
	own := tenantIndex(o.Request.Tenant)
	order := []int{own}
	for t := range c.refs {
		if t != own {
			order = append(order, t)
		}
	}
	for _, t := range order {
		for j, ref := range c.refs[t] {
			if (t == own && j == o.Request.Prompt) || !slices.Equal(got, c.answerOf(ref, len(got))) {
				continue
			}
			v.Owner, v.CrossRequest, v.CrossTenant = TenantName(t), t == own, t != own
			v.Why += fmt.Sprintf("; the tokens are those of %s's prompt %d", TenantName(t), j)
			return v
		}
	}
	return v
}

// tenantIndex is t of TenantName(t).
func tenantIndex(name string) int {
	var t int
	if _, err := fmt.Sscanf(name, "tenant-%d", &t); err != nil {
		panic(fmt.Sprintf("live: tenant name %q is not one of a workload", name))
	}
	return t
}

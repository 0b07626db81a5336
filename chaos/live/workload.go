package live

import (
	"fmt"
	"math/rand/v2"
	"strings"
)

// Bounds of a workload.
const (
	// TenantsMax bounds WorkloadConfig.Tenants: each tenant is a client
	// with its own certificate and remote endpoint.
	TenantsMax = 64
	// PromptsPerTenantMax bounds WorkloadConfig.PromptsPerTenant: the
	// checker computes one reference per prompt before the first check.
	PromptsPerTenantMax = 256
	// promptHeaderBytesMax is the longest canary header,
	// "tenant-63 canary ffff: ".
	promptHeaderBytesMax = 23
)

// WorkloadConfig shapes a campaign's requests. Prompts are ASCII, so a
// prompt's bytes are its tokens under the byte tokenizer.
type WorkloadConfig struct {
	// Tenants is how many tenants send requests, 1 to TenantsMax.
	Tenants int
	// PromptsPerTenant is how many distinct prompts each tenant sends, 1
	// to PromptsPerTenantMax; every request is one of them (or oversize).
	PromptsPerTenant int
	// PromptBytesMin and PromptBytesMax bound a prompt's length in bytes,
	// canary header included: with the built-in model's byte tokenizer a
	// prompt is BOS and one token per byte.
	PromptBytesMin, PromptBytesMax int
	// MaxTokensMax bounds what a request asks to generate: drawn from
	// [1, MaxTokensMax].
	MaxTokensMax int
	// ContextTokens is the cluster's context window, in tokens. Every
	// prompt but an oversize one fits it with its tokens to generate;
	// an oversize one does not, and must be refused.
	ContextTokens int
	// Oversize is the share of requests, in [0, 1], whose prompt alone,
	// or prompt and tokens to generate, exceed ContextTokens.
	Oversize float64
	// Cancel is the share of requests, in [0, 1], that the client
	// cancels after a drawn number of streamed tokens.
	Cancel float64
	// SharedPrefixes is how many texts of SharedPrefixBytes bytes every
	// tenant's prompts may start with (a system prompt, shared by all):
	// a prompt starts with one of them, or none, drawn alike, before its
	// canary header. Prefills of them hit the prefix cache in their own
	// scope and look it up across scopes, where they must miss.
	SharedPrefixes, SharedPrefixBytes int
	// Salted is the share of requests, in [0, 1], that send a cache salt
	// (one of two, the same for every tenant), which narrows their scope.
	Salted float64
}

// DefaultWorkloadConfig is four tenants of eight prompts each, 24 to 160
// bytes long, two thirds of them starting with one of two shared 48-byte
// prefixes, up to 16 tokens each, in a 2048-token window, with 5 %
// oversize prompts, 5 % cancellations and 25 % salted requests.
func DefaultWorkloadConfig() WorkloadConfig {
	return WorkloadConfig{Tenants: 4, PromptsPerTenant: 8, PromptBytesMin: 24, PromptBytesMax: 160, MaxTokensMax: 16,
		ContextTokens: 2048, Oversize: 0.05, Cancel: 0.05, SharedPrefixes: 2, SharedPrefixBytes: 48, Salted: 0.25}
}

// salts are the cache salts a salted request sends.
var salts = [...]string{"salt-1", "salt-2"}

// Validate reports the first setting out of range, with its value.
func (c WorkloadConfig) Validate() error {
	switch {
	case c.Tenants < 1 || c.Tenants > TenantsMax:
		return fmt.Errorf("live: tenants (%d) must be 1 to %d", c.Tenants, TenantsMax)
	case c.PromptsPerTenant < 1 || c.PromptsPerTenant > PromptsPerTenantMax:
		return fmt.Errorf("live: prompts per tenant (%d) must be 1 to %d", c.PromptsPerTenant, PromptsPerTenantMax)
	case c.PromptBytesMin < promptHeaderBytesMax+1 || c.PromptBytesMax < c.PromptBytesMin:
		return fmt.Errorf("live: prompt bytes from %d to %d: want %d ≤ min ≤ max", c.PromptBytesMin, c.PromptBytesMax,
			promptHeaderBytesMax+1)
	case c.MaxTokensMax < 1:
		return fmt.Errorf("live: max tokens (%d) must be at least 1", c.MaxTokensMax)
	case c.PromptBytesMax+1+c.MaxTokensMax > c.ContextTokens:
		return fmt.Errorf("live: a prompt of %d bytes (and BOS) and %d tokens to generate exceed the %d-token context window: "+
			"every prompt but an oversize one must fit", c.PromptBytesMax, c.MaxTokensMax, c.ContextTokens)
	case !(c.Oversize >= 0 && c.Oversize <= 1) || !(c.Cancel >= 0 && c.Cancel <= 1) || !(c.Salted >= 0 && c.Salted <= 1):
		return fmt.Errorf("live: the shares of oversize prompts (%g), cancellations (%g) and salted requests (%g) must be in [0, 1]",
			c.Oversize, c.Cancel, c.Salted)
	case c.SharedPrefixes < 0 || c.SharedPrefixBytes < 0:
		return fmt.Errorf("live: shared prefixes (%d of %d bytes) must not be negative", c.SharedPrefixes, c.SharedPrefixBytes)
	case c.SharedPrefixes > 0 && c.PromptBytesMax < c.SharedPrefixBytes+promptHeaderBytesMax+1:
		return fmt.Errorf("live: a prompt of at most %d bytes cannot hold a shared prefix of %d bytes and a %d-byte canary header",
			c.PromptBytesMax, c.SharedPrefixBytes, promptHeaderBytesMax)
	}
	return nil
}

// Request is one request of a workload.
type Request struct {
	// Index numbers the campaign's requests from 0.
	Index  int
	Tenant string
	// Prompt indexes the tenant's prompts (Workload.Prompt); -1 for an
	// oversize prompt, which has none.
	Prompt    int
	Text      string
	MaxTokens int
	// Oversize: the prompt, or the prompt with MaxTokens, exceeds the
	// context window, and must be refused with prompt_too_long.
	Oversize bool
	// CancelAfter is how many streamed tokens the client waits for
	// before it cancels; 0 never cancels.
	CancelAfter int
	// CacheSalt is the cache salt the request sends, if any.
	CacheSalt string
}

// Workload is the requests of one seed: request i is the same for the
// same seed and configuration, whatever order requests are drawn in. It
// is immutable, and safe for concurrent use.
type Workload struct {
	cfg      WorkloadConfig
	seed     uint64
	canaries []string   // by tenant
	prompts  [][]string // by tenant, then prompt
	shared   []string   // the shared prefixes
}

// words make the prompts' bodies.
var words = strings.Fields(`the page cache tenant request token prefill decode router pool frame tag lease seal
	answer model window admission transfer generation owner checksum plan ack release node cluster`)

// NewWorkload validates cfg and draws every tenant's canary and prompts.
func NewWorkload(seed uint64, cfg WorkloadConfig) (*Workload, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	w := &Workload{cfg: cfg, seed: seed}
	rnd := newRand(seed, streamWorkload)
	seen := map[string]bool{}
	for range cfg.Tenants {
		c := fmt.Sprintf("%04x", rnd.Uint32()&0xffff)
		for seen[c] {
			c = fmt.Sprintf("%04x", rnd.Uint32()&0xffff)
		}
		seen[c] = true
		w.canaries = append(w.canaries, c)
	}
	for k := range cfg.SharedPrefixes {
		w.shared = append(w.shared, wordsOf(fmt.Sprintf("shared prefix %d: ", k), cfg.SharedPrefixBytes, rnd))
	}
	for t := range cfg.Tenants {
		var ps []string
		for range cfg.PromptsPerTenant {
			prefix := ""
			if k := rnd.IntN(cfg.SharedPrefixes + 1); k < cfg.SharedPrefixes {
				prefix = w.shared[k]
			}
			lo := max(cfg.PromptBytesMin, len(prefix)+promptHeaderBytesMax+1)
			n := lo + rnd.IntN(cfg.PromptBytesMax-lo+1)
			ps = append(ps, prefix+w.text(t, n-len(prefix), rnd))
		}
		w.prompts = append(w.prompts, ps)
	}
	return w, nil
}

// SharedPrefix is the prefix prompt j of tenant t starts with, if any.
func (w *Workload) SharedPrefix(t, j int) string {
	for _, s := range w.shared {
		if strings.HasPrefix(w.prompts[t][j], s) {
			return s
		}
	}
	return ""
}

// TenantName is the name of tenant t.
func TenantName(t int) string { return fmt.Sprintf("tenant-%d", t) }

// Tenants are the workload's tenants' names.
func (w *Workload) Tenants() []string {
	out := make([]string, w.cfg.Tenants)
	for t := range out {
		out[t] = TenantName(t)
	}
	return out
}

// Canary is tenant t's canary, in each of its prompts.
func (w *Workload) Canary(t int) string { return w.canaries[t] }

// Prompt is prompt j of tenant t.
func (w *Workload) Prompt(t, j int) string { return w.prompts[t][j] }

// Config is the workload's configuration.
func (w *Workload) Config() WorkloadConfig { return w.cfg }

// text is n bytes of tenant t's prompt: the canary header, then words.
func (w *Workload) text(t, n int, rnd *rand.Rand) string {
	return wordsOf(fmt.Sprintf("%s canary %s: ", TenantName(t), w.canaries[t]), n, rnd)
}

// wordsOf is head and then words, n bytes in all.
func wordsOf(head string, n int, rnd *rand.Rand) string {
	var b strings.Builder
	b.WriteString(head)
	for b.Len() < n {
		b.WriteString(words[rnd.IntN(len(words))])
		b.WriteByte(' ')
	}
	return b.String()[:n]
}

// Request is request i. Its tenant, prompt, token count, whether it is
// oversize and when it is cancelled are drawn from its own stream of the
// seed.
func (w *Workload) Request(i int) Request {
	rnd := newRand(w.seed^uint64(i)*0x9e3779b97f4a7c15, streamRequest)
	c := w.cfg
	t := rnd.IntN(c.Tenants)
	r := Request{Index: i, Tenant: TenantName(t), MaxTokens: 1 + rnd.IntN(c.MaxTokensMax)}
	oversize, cancel := rnd.Float64() < c.Oversize, rnd.Float64() < c.Cancel
	if rnd.Float64() < c.Salted {
		r.CacheSalt = salts[rnd.IntN(len(salts))]
	}
	if oversize {
		return w.oversize(r, t, rnd)
	}
	r.Prompt = rnd.IntN(c.PromptsPerTenant)
	r.Text = w.prompts[t][r.Prompt]
	if cancel {
		r.CancelAfter = 1 + rnd.IntN(max(r.MaxTokens-1, 1))
	}
	return r
}

// oversize makes r's prompt exceed the window: alone, or with its tokens
// to generate while the prompt alone fits.
func (w *Workload) oversize(r Request, t int, rnd *rand.Rand) Request {
	ctx := w.cfg.ContextTokens
	r.Prompt, r.Oversize = -1, true
	n := ctx + 1 + rnd.IntN(ctx/4+1)
	if rnd.IntN(2) == 1 {
		r.MaxTokens = 2 + rnd.IntN(max(w.cfg.MaxTokensMax-1, 1))
		n = ctx - r.MaxTokens + 1 + rnd.IntN(r.MaxTokens-1)
	}
	r.Text = w.text(t, n, rnd)
	return r
}

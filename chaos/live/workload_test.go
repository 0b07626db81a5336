package live

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func newTestWorkload(t *testing.T, seed uint64, cfg WorkloadConfig) *Workload {
	t.Helper()
	w, err := NewWorkload(seed, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestWorkloadIsTheSeeds(t *testing.T) {
	cfg := DefaultWorkloadConfig()
	a, b := newTestWorkload(t, 9, cfg), newTestWorkload(t, 9, cfg)
	// Drawn in another order, request i is the same request.
	back := map[int]Request{}
	for i := 499; i >= 0; i-- {
		back[i] = b.Request(i)
	}
	for i := range 500 {
		if !reflect.DeepEqual(a.Request(i), back[i]) {
			t.Fatalf("request %d differs between two workloads of one seed", i)
		}
	}
	c := newTestWorkload(t, 10, cfg)
	same := 0
	for i := range 100 {
		if reflect.DeepEqual(a.Request(i), c.Request(i)) {
			same++
		}
	}
	if same > 10 {
		t.Errorf("seeds 9 and 10 share %d of 100 requests", same)
	}
}

func TestWorkloadPrompts(t *testing.T) {
	cfg := DefaultWorkloadConfig()
	cfg.Tenants, cfg.Oversize, cfg.Cancel = 12, 0.1, 0.1
	w := newTestWorkload(t, 3, cfg)
	canaries := map[string]bool{}
	sharers := map[string]map[int]bool{} // the tenants whose prompts start with each shared prefix
	for tn := range cfg.Tenants {
		canaries[w.Canary(tn)] = true
		for j := range cfg.PromptsPerTenant {
			p := w.Prompt(tn, j)
			prefix := w.SharedPrefix(tn, j)
			if prefix != "" {
				if len(prefix) != cfg.SharedPrefixBytes || strings.Contains(prefix, "canary") {
					t.Errorf("tenant %d's prompt %d starts with %q, not a shared prefix of %d bytes", tn, j, prefix, cfg.SharedPrefixBytes)
				}
				if sharers[prefix] == nil {
					sharers[prefix] = map[int]bool{}
				}
				sharers[prefix][tn] = true
			}
			if head := fmt.Sprintf("tenant-%d canary %s: ", tn, w.Canary(tn)); !strings.HasPrefix(p[len(prefix):], head) {
				t.Errorf("tenant %d's prompt %d %q does not go on with %q after its shared prefix %q", tn, j, p, head, prefix)
			}
			if len(p) < cfg.PromptBytesMin || len(p) > cfg.PromptBytesMax {
				t.Errorf("tenant %d's prompt %d is %d bytes, want %d to %d", tn, j, len(p), cfg.PromptBytesMin, cfg.PromptBytesMax)
			}
		}
	}
	if len(canaries) != cfg.Tenants {
		t.Errorf("%d tenants share %d canaries", cfg.Tenants, len(canaries))
	}
	// 12 tenants of 8 prompts, a third of them starting with each prefix:
	// every prefix is shared by several tenants.
	if len(sharers) != cfg.SharedPrefixes {
		t.Errorf("%d shared prefixes begin prompts, want %d", len(sharers), cfg.SharedPrefixes)
	}
	for prefix, ts := range sharers {
		if len(ts) < 3 {
			t.Errorf("shared prefix %q begins prompts of %d tenants", prefix, len(ts))
		}
	}
	var oversize, cancel, salted int
	for i := range 2000 {
		r := w.Request(i)
		fits := len(r.Text)+r.MaxTokens <= cfg.ContextTokens
		switch {
		case r.Oversize == fits:
			t.Errorf("request %d: oversize %t, %d prompt tokens and %d to generate in a window of %d", i, r.Oversize,
				len(r.Text), r.MaxTokens, cfg.ContextTokens)
		case r.Oversize:
			oversize++
		case r.Text != w.Prompt(tenantIndex(r.Tenant), r.Prompt):
			t.Errorf("request %d's text is not its tenant's prompt %d", i, r.Prompt)
		}
		if r.CacheSalt != "" {
			salted++
		}
		if r.CancelAfter > 0 {
			cancel++
			if r.Oversize || r.CancelAfter > max(r.MaxTokens-1, 1) {
				t.Errorf("request %d (oversize %t, %d tokens) cancels after %d", i, r.Oversize, r.MaxTokens, r.CancelAfter)
			}
		}
	}
	// 10 % of 2000 each, drawn: far from 0 and from all.
	if oversize < 100 || oversize > 300 || cancel < 100 || cancel > 300 {
		t.Errorf("of 2000 requests %d oversize and %d cancelled, want about 200 each", oversize, cancel)
	}
	if salted < 400 || salted > 600 {
		t.Errorf("of 2000 requests %d salted, want about 500", salted)
	}
}

func TestWorkloadRefuses(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  func(*WorkloadConfig)
		want string
	}{
		{"tenants", func(c *WorkloadConfig) { c.Tenants = 0 }, "tenants (0)"},
		{"too many tenants", func(c *WorkloadConfig) { c.Tenants = TenantsMax + 1 }, "tenants (65)"},
		{"prompt shorter than its header", func(c *WorkloadConfig) { c.PromptBytesMin = 10 }, "prompt bytes from 10"},
		{"prompts that do not fit", func(c *WorkloadConfig) { c.PromptBytesMax = 2040 }, "a prompt of 2040 bytes (and BOS) and 16 tokens"},
		{"salted share", func(c *WorkloadConfig) { c.Salted = 1.5 }, "salted requests (1.5)"},
		{"prompts too short for a shared prefix", func(c *WorkloadConfig) { c.PromptBytesMax = 60 }, "cannot hold a shared prefix of 48 bytes"},
		{"share", func(c *WorkloadConfig) { c.Oversize = 1.5 }, "oversize prompts (1.5)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultWorkloadConfig()
			tc.cfg(&c)
			if _, err := NewWorkload(1, c); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("NewWorkload: %v, want an error saying %q", err, tc.want)
			}
		})
	}
}

// The checker's answer of n tokens, cut from a reference of more, is the
// one engine.Model.Answer computes for n: what a node must answer.
func TestAnswerOfIsGPUAnswer(t *testing.T) {
	m := defaultModel(t)
	w := newTestWorkload(t, 5, WorkloadConfig{Tenants: 2, PromptsPerTenant: 2, PromptBytesMin: 24, PromptBytesMax: 48,
		MaxTokensMax: 24, ContextTokens: 2048})
	c := NewChecker(m, w, 2)
	for tn := range 2 {
		for j := range 2 {
			for _, n := range []int{1, 5, 24} {
				want, err := m.Answer(w.Prompt(tn, j), n)
				if err != nil {
					t.Fatal(err)
				}
				if got := c.Reference(tn, j, n); !slices.Equal(got, want) {
					t.Errorf("tenant %d prompt %d, %d tokens: %v, Model.Answer %v", tn, j, n, got, want)
				}
			}
		}
	}
}

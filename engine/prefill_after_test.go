package engine

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

var (
	// acme is the scope of ownerA's and ownerB's tenant.
	acme = kv.TenantScope(ownerA.Tenant)
	// reader is a request of acme that finds another's pages cached.
	reader = kv.Owner{Request: 4, Tenant: ownerA.Tenant}

	stories260KModel *ReferenceEngine
)

// stories260K is the real model's engine, read once per test binary.
func stories260K(tb testing.TB) *ReferenceEngine {
	tb.Helper()
	if stories260KModel == nil {
		cfg, w, _ := readStories260K(tb)
		e, err := NewEngine(cfg, w)
		if err != nil {
			tb.Fatal(err)
		}
		stories260KModel = e
	}
	return stories260KModel
}

// cachedPrefix prefills prompt as ownerB, publishes its first k pages
// under acme's scope and leases them as reader: the cached prefix another
// request of the tenant finds.
func cachedPrefix(tb testing.TB, e Engine, p *kv.Pool, prompt []int, k int) ([]kv.CachedPage, []kv.Lease) {
	tb.Helper()
	pf := prefill(tb, e, p, ownerB, prompt)
	cached := make([]kv.CachedPage, k)
	leases := make([]kv.Lease, k)
	for i := range k {
		var err error
		if cached[i], err = p.Publish(pf.Manifest.Pages[i].Tag, ownerB, acme); err != nil {
			tb.Fatal(err)
		}
		if leases[i], err = p.LeaseShared(cached[i], reader, acme); err != nil {
			tb.Fatal(err)
		}
	}
	return cached, leases
}

// prefillAfter reserves the prompt's pages for o and prefills them after
// prefix.
func prefillAfter(tb testing.TB, e Engine, p *kv.Pool, o kv.Owner, prompt []int, prefix []kv.Lease) Prefilled {
	tb.Helper()
	g := p.Config().Geometry
	pf, err := e.PrefillAfter(p, o, reserve(tb, p, o, 0, g.PagesFor(len(prompt))), prompt, prefix)
	if err != nil {
		tb.Fatal(err)
	}
	return pf
}

// pageBytes is a copy of the bytes of every page of m, read through a
// lease of its owner.
func pageBytes(t *testing.T, p *kv.Pool, m *kv.Manifest) [][]byte {
	t.Helper()
	out := make([][]byte, len(m.Pages))
	for i, mp := range m.Pages {
		l, err := p.Lease(mp.Tag, m.Owner)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := p.Read(l)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = bytes.Clone(b)
		if err := p.Unlease(l); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// samePrefill checks that got has want's first token and token counts,
// and that each of its pages holds exactly the bytes of want's page and
// was sealed with the checksum of those bytes at its place.
func samePrefill(t *testing.T, p *kv.Pool, got, want Prefilled) {
	t.Helper()
	if got.First != want.First {
		t.Fatalf("first token %d, want %d", got.First, want.First)
	}
	if got.Manifest.Tokens != want.Manifest.Tokens || len(got.Manifest.Pages) != len(want.Manifest.Pages) {
		t.Fatalf("manifest of %d tokens in %d pages, want %d in %d",
			got.Manifest.Tokens, len(got.Manifest.Pages), want.Manifest.Tokens, len(want.Manifest.Pages))
	}
	pt := p.Config().Geometry.PageTokens
	gotBytes, wantBytes := pageBytes(t, p, got.Manifest), pageBytes(t, p, want.Manifest)
	for i, mp := range got.Manifest.Pages {
		if mp.Tokens != want.Manifest.Pages[i].Tokens {
			t.Fatalf("page %d holds %d tokens, want %d", i, mp.Tokens, want.Manifest.Pages[i].Tokens)
		}
		if !bytes.Equal(gotBytes[i], wantBytes[i]) {
			t.Fatalf("page %d of %d: bytes differ", i, len(got.Manifest.Pages))
		}
		if sum := kv.PageChecksum(mp.Tag, got.Manifest.Owner, i*pt, mp.Tokens, wantBytes[i]); mp.Checksum != sum {
			t.Fatalf("page %d sealed with checksum %#x, want %#x", i, mp.Checksum, sum)
		}
	}
	if err := got.Manifest.Verify(p); err != nil {
		t.Fatal(err)
	}
}

// TestPrefillAfterEqualsPrefill: a prefill after any number of cached
// pages of the prompt gives the pages, manifest and first token of a
// prefill of the whole prompt, bit for bit, for prompts that end on a page
// boundary and prompts that do not, in the generated model (32- and 16-bit
// KV) and the real stories260K.
func TestPrefillAfterEqualsPrefill(t *testing.T) {
	f16 := DefaultModelConfig()
	f16.KVDType = kv.F16
	for _, m := range []struct {
		name   string
		engine func(testing.TB) *ReferenceEngine
	}{
		{"default", func(tb testing.TB) *ReferenceEngine { return engineFor(tb, DefaultModelConfig()) }},
		{"default-f16", func(tb testing.TB) *ReferenceEngine { return engineFor(tb, f16) }},
		{"stories260K", stories260K},
	} {
		for _, pt := range []int{4, 16} {
			for _, n := range []int{pt + 1, 2 * pt, 3*pt + 3, 5 * pt} {
				for k := 1; k*pt < n; k++ {
					t.Run(fmt.Sprintf("%s/page=%d/prompt=%d/cached=%d", m.name, pt, n, k), func(t *testing.T) {
						e := m.engine(t)
						g := e.Config().Geometry(pt)
						p := fragmentedPool(t, g, 6*g.PagesFor(n)+3, 11, uint64(n*k))
						prompt := testPrompt(n, "after")
						whole := prefill(t, e, p, ownerA, prompt)
						_, prefix := cachedPrefix(t, e, p, prompt, k)
						samePrefill(t, p, prefillAfter(t, e, p, reader, prompt, prefix), whole)
						if st := p.Stats(); st.Refused.Total() != 0 {
							t.Fatalf("pool refused %+v on the checked path", st.Refused)
						}
					})
				}
			}
		}
	}
}

// TestPrefillAfterReadsCachedKV: the prefix's KV comes from the cached
// pages, not from the prompt's tokens: after pages cached from another
// prompt, the prefill is that of the other prompt's prefix followed by
// the rest of this one.
func TestPrefillAfterReadsCachedKV(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(4)
	p := fragmentedPool(t, g, 64, 12, 1)
	const n, k = 13, 2
	prompt, other := testPrompt(n, "mine"), testPrompt(n, "theirs")
	spliced := append(other[:k*g.PageTokens:k*g.PageTokens], prompt[k*g.PageTokens:]...)
	want := prefill(t, e, p, ownerA, spliced)
	_, prefix := cachedPrefix(t, e, p, other, k)
	got := prefillAfter(t, e, p, reader, prompt, prefix)
	samePrefill(t, p, got, want)
	own := prefill(t, e, p, ownerC, prompt)
	if mine, theirs := pageBytes(t, p, own.Manifest), pageBytes(t, p, got.Manifest); bytes.Equal(mine[k], theirs[k]) {
		t.Fatal("the rows after another prompt's prefix are those after the prompt's own: the test cannot tell them apart")
	}
}

// untouched checks that nothing was written to tags: each is still
// reserved and empty.
func untouched(t *testing.T, p *kv.Pool, tags []kv.Tag) {
	t.Helper()
	for i, tag := range tags {
		if info := p.Inspect(tag.Index); info.Tag != tag || info.State != kv.Reserved || info.Tokens != 0 {
			t.Fatalf("tag %d (%s) after a refused prefill: %s %s with %d tokens", i, tag, info.Tag, info.State, info.Tokens)
		}
	}
}

func TestPrefillAfterRefuses(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(4)
	writer := testPrompt(12, "refuse")
	setup := func(t *testing.T, k, n int) (*kv.Pool, []kv.CachedPage, []kv.Lease, []kv.Tag) {
		p := fragmentedPool(t, g, 32, 13, 2)
		cached, prefix := cachedPrefix(t, e, p, writer, k)
		return p, cached, prefix, reserve(t, p, reader, 0, g.PagesFor(n))
	}

	for _, c := range []struct{ k, n int }{{2, 8}, {3, 10}, {3, 9}} {
		t.Run(fmt.Sprintf("prefix of %d pages for %d tokens", c.k, c.n), func(t *testing.T) {
			p, _, prefix, tags := setup(t, c.k, c.n)
			_, err := e.PrefillAfter(p, reader, tags, writer[:c.n], prefix)
			var pe *CachedPrefixError
			if !errors.As(err, &pe) || *pe != (CachedPrefixError{Pages: c.k, PageTokens: 4, Prompt: c.n}) {
				t.Fatalf("prefill of %d tokens after %d cached pages: %v", c.n, c.k, err)
			}
			untouched(t, p, tags)
		})
	}
	t.Run("page not full", func(t *testing.T) {
		p := fragmentedPool(t, g, 32, 13, 3)
		pf := prefill(t, e, p, ownerB, writer[:10]) // 4, 4 and 2 tokens
		var prefix []kv.Lease
		for _, i := range []int{0, 2} {
			l, err := p.Lease(pf.Manifest.Pages[i].Tag, ownerB)
			if err != nil {
				t.Fatal(err)
			}
			prefix = append(prefix, l)
		}
		tags := reserve(t, p, reader, 0, 3)
		_, err := e.PrefillAfter(p, reader, tags, writer[:10], prefix)
		var me *kv.ManifestError
		if !errors.As(err, &me) || me.Page != 1 || me.Want != 4 || me.Have != 2 {
			t.Fatalf("prefill after a page of 2 tokens: %v", err)
		}
		untouched(t, p, tags)
	})
	t.Run("evicted and reclaimed", func(t *testing.T) {
		p, cached, prefix, tags := setup(t, 2, 12)
		if freed, err := p.Evict(cached[1], epoch); err != nil || freed {
			t.Fatalf("eviction of a leased page: freed %t, %v", freed, err)
		}
		if rs := p.Tick(epoch.Add(time.Minute)); len(rs) != 1 || rs[0].Tag != cached[1].Tag {
			t.Fatalf("reclaims %+v, want the evicted page's alone", rs)
		}
		_, err := e.PrefillAfter(p, reader, tags, writer, prefix)
		var stale *kv.StaleTagError
		if !errors.As(err, &stale) || stale.Have != prefix[1].Tag {
			t.Fatalf("prefill after a reclaimed page: %v", err)
		}
		untouched(t, p, tags)
	})
	t.Run("unleased and evicted", func(t *testing.T) {
		p, cached, prefix, tags := setup(t, 2, 12)
		if err := p.Unlease(prefix[0]); err != nil {
			t.Fatal(err)
		}
		if freed, err := p.Evict(cached[0], epoch); err != nil || !freed {
			t.Fatalf("eviction of an unleased page: freed %t, %v", freed, err)
		}
		_, err := e.PrefillAfter(p, reader, tags, writer, prefix)
		var stale *kv.StaleTagError
		if !errors.As(err, &stale) || stale.Have != prefix[0].Tag {
			t.Fatalf("prefill after an evicted page: %v", err)
		}
		untouched(t, p, tags)
	})
	t.Run("other scope", func(t *testing.T) {
		p, _, prefix, tags := setup(t, 2, 12)
		prefix[1].Scope = kv.TenantScope(ownerC.Tenant)
		_, err := e.PrefillAfter(p, reader, tags, writer, prefix)
		var ws *kv.WrongScopeError
		if !errors.As(err, &ws) || ws.Page != prefix[1].Tag {
			t.Fatalf("prefill through a lease of another scope: %v", err)
		}
		untouched(t, p, tags)
	})
}

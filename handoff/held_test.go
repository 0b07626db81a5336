package handoff

import (
	"errors"
	"slices"
	"testing"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// withDecodeCache gives the pair's decode pool a prefix cache of at most
// pages pages, scoped by tenant and salt.
func (p *pair) withDecodeCache(pages int) {
	p.t.Helper()
	p.heldPages, p.held = &lossyPages{PoolPages: p.decode}, p.tenantCache(pages)
}

// withPrefillCache gives the pair's prefill pool one.
func (p *pair) withPrefillCache(pages int) {
	p.t.Helper()
	p.prefixPages, p.prefixCache = &lossyPages{PoolPages: p.prefill}, p.tenantCache(pages)
}

func (p *pair) tenantCache(pages int) *PrefixCache {
	c, err := NewPrefixCache(pages, testModel.String(), func(tenant, salt string) kv.Scope {
		return kv.TenantScope(tenant).Narrow(salt)
	})
	if err != nil {
		p.t.Fatal(err)
	}
	return c
}

// heldRun is one request through the pair as tenant: the pages its plan
// said decode holds, the frames prefill sent, and its answer's tokens
// checked against the reference.
func (p *pair) heldRun(tenant, salt string, prompt []int) (held, frames int) {
	p.t.Helper()
	held, frames = p.heldStart(tenant, salt, prompt, nil)
	want, err := p.engine.Reference(prompt, 4)
	if err != nil {
		p.t.Fatal(err)
	}
	if i := slices.Index(want, engine.EOS); i >= 0 {
		want = want[:i+1]
	}
	if p.finish == nil || p.finish.Cause != nil || !slices.Equal(p.tokens, want) {
		p.t.Fatalf("%s's request: finish %+v, tokens %v; the reference gives %v", tenant, p.finish, p.tokens, want)
	}
	return held, frames
}

// heldStart runs one request through the pair as tenant, with tamper, if
// set, seeing each effect first, and carries its Keep out after its decode
// job ended; it returns the pages its plan said decode holds and the
// frames prefill sent.
func (p *pair) heldStart(tenant, salt string, prompt []int, tamper func(Effect)) (held, frames int) {
	p.observe = func(e Effect) {
		switch e := e.(type) {
		case SendPlan:
			held = int(e.Plan.HeldPages)
		case SendFrames:
			frames = len(p.frames[e.Key].Frames)
		}
		if tamper != nil {
			tamper(e)
		}
	}
	p.tokens, p.finish = nil, nil
	id := uint64(1)
	if p.req != nil {
		id = p.req.Owner().Request + 1
	}
	p.req = NewRequest(p.config(), kv.Owner{Request: id, Tenant: tenant}, 7, prompt, 4, Peer{Address: "prefill:1", Incarnation: prefillInc})
	p.req.NarrowCache(salt)
	p.step(p.req, Start{})
	for _, k := range p.keeps {
		ExecKeep(p.heldPages, p.held, k, nil)
	}
	p.keeps = nil
	return held, frames
}

// TestDecodeHoldsTheCachedPrefix: an answered request's full prompt pages
// stay in the decode pool's cache; the next request of the same tenant
// whose prompt starts with them copies them, names them in its plan, and
// prefill sends only the pages after them; another tenant, or the same
// tenant under another salt, holds none. Every answer is the reference's,
// and once the cache is emptied every page of both pools is free.
func TestDecodeHoldsTheCachedPrefix(t *testing.T) {
	p := newPair(t, 64, 64)
	p.withDecodeCache(32)
	prefix := []int{engine.BOS, 'o', 'n', 'c', 'e', ' ', 'u', 'p', 'o', 'n', ' ', 'a', ' ', 't', 'i', 'm'} // 4 pages of 4
	first, second := append(slices.Clone(prefix), 'e', '.', ' '), append(slices.Clone(prefix), 'e', '!')
	if held, frames := p.heldRun("acme", "", first); held != 0 || frames != 5 {
		t.Fatalf("the first request: %d pages held, %d frames sent; want 0 and 5", held, frames)
	}
	if st := p.held.Stats(); st.Published != 4 || st.Pages != 4 {
		t.Fatalf("after the first answer the decode cache published %d pages and holds %d, want its 4 full pages", st.Published, st.Pages)
	}
	for _, c := range []struct {
		tenant, salt string
		held, frames int
	}{
		{"acme", "", 4, 1},
		{"globex", "", 0, 5},
		{"acme", "conversation-2", 0, 5},
		{"acme", "conversation-2", 4, 1},
	} {
		if held, frames := p.heldRun(c.tenant, c.salt, second); held != c.held || frames != c.frames {
			t.Errorf("%s (salt %q): %d pages held, %d frames sent; want %d and %d", c.tenant, c.salt, held, frames, c.held, c.frames)
		}
	}
	if s := p.prefill.Stats(); s.Free != s.Capacity {
		t.Errorf("prefill pool: %d of %d pages free", s.Free, s.Capacity)
	}
	s := p.decode.Stats()
	if s.Free+s.Cached != s.Capacity || s.Cached != p.held.Stats().Pages {
		t.Errorf("decode pool: %d free and %d cached of %d, the index holds %d", s.Free, s.Cached, s.Capacity, p.held.Stats().Pages)
	}
	p.held.evict(p.heldPages, p.held.index.Len(), p.held.index.Uses()+1)
	if s := p.decode.Stats(); s.Free != s.Capacity {
		t.Errorf("decode pool with its cache emptied: %d of %d pages free", s.Free, s.Capacity)
	}
}

// TestDecodeHeldPageGoneIsAMiss: a cached page evicted under the index
// (its lease refused) ends the held run there: the request asks prefill
// for every page after it, and is answered right.
func TestDecodeHeldPageGoneIsAMiss(t *testing.T) {
	p := newPair(t, 64, 64)
	p.withDecodeCache(32)
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n'} // 3 full pages
	p.heldRun("acme", "", prompt)
	pages := p.held.index.Pages()
	if len(pages) != 3 {
		t.Fatalf("the decode cache holds %d pages, want 3", len(pages))
	}
	for _, c := range pages {
		if c.First == 4 {
			if _, err := p.decode.Evict(c, p.now); err != nil {
				t.Fatal(err)
			}
		}
	}
	if held, frames := p.heldRun("acme", "", prompt); held != 1 || frames != 3 {
		t.Fatalf("with the second cached page gone: %d pages held, %d frames sent; want 1 and 3", held, frames)
	}
	if st := p.held.Stats(); st.Gone != 1 {
		t.Fatalf("%d pages found gone, want 1", st.Gone)
	}
}

// TestWrongIndexEntryIsRefusedAtThePage: an index that finds another
// scope's page under a request's key (a bug planted here: the page of
// group "team" filed under acme's key) hands out no byte of it: the lease
// is asked under the request's own scope, which the page refuses; the
// entry is forgotten and the request takes a miss, on the decode node
// and on the prefill worker alike. (A group's scope admits every tenant:
// leased under the scope the entry names, the page would be read.)
func TestWrongIndexEntryIsRefusedAtThePage(t *testing.T) {
	p := newPair(t, 64, 64)
	p.withDecodeCache(32)
	scopes := map[string]kv.Scope{"hooli": kv.SharedScope("team"), "acme": kv.TenantScope("acme")}
	p.held.scopeOf = func(tenant, _ string) kv.Scope { return scopes[tenant] }
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n'} // 3 full pages
	p.heldRun("hooli", "", prompt)
	team := p.held.index.Pages()
	acme, err := PromptKeys(scopes["acme"], testModel.String(), p.decode.Geometry(), prompt)
	if err != nil || len(team) != 3 {
		t.Fatalf("%d pages cached for the group (%v)", len(team), err)
	}
	for _, c := range team {
		p.held.index.Remove(c.Tag)
		if err := p.held.index.Add(acme[c.First/4], c); err != nil {
			t.Fatal(err)
		}
	}
	if held, frames := p.heldRun("acme", "", prompt); held != 0 || frames != 4 {
		t.Fatalf("acme over an index with the group's pages under its keys: %d pages held, %d frames; want 0 and 4", held, frames)
	}
	if st := p.held.Stats(); st.Gone != 1 {
		t.Fatalf("%d entries found gone, want the first wrong one", st.Gone)
	}

	w := newCacheWorld(t, 16, 8)
	w.cache.scopeOf = p.held.scopeOf
	w.run("hooli", prompt)
	for _, c := range w.cache.index.Pages() {
		w.cache.index.Remove(c.Tag)
		if err := w.cache.index.Add(acme[c.First/4], c); err != nil {
			t.Fatal(err)
		}
	}
	if out := w.run("acme", prompt); out.Err != nil || out.Cached != 0 {
		t.Fatalf("a prefill of acme over the group's pages under its keys read %d tokens from the cache (%v), want none", out.Cached, out.Err)
	}
}

// TestPrefillKeepsWhatDecodeHolds: a prefill whose prompt's first pages
// decode holds, and which computed them (its own cache had given them up),
// keeps them in its cache although it does not send them, so that the
// next request reads them there instead of computing them again.
func TestPrefillKeepsWhatDecodeHolds(t *testing.T) {
	p := newPair(t, 64, 64)
	p.withDecodeCache(32)
	p.withPrefillCache(32)
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n'} // 3 full pages
	p.heldRun("acme", "", prompt)
	if st := p.prefixCache.Stats(); st.Published != 3 {
		t.Fatalf("prefill's cache kept %d pages of the first request, want 3", st.Published)
	}
	p.prefixCache.evict(p.prefixPages, 3, p.prefixCache.index.Uses()+1)
	if held, frames := p.heldRun("acme", "", prompt); held != 3 || frames != 1 {
		t.Fatalf("the second request: %d pages held, %d frames sent; want 3 and 1", held, frames)
	}
	if st := p.prefixCache.Stats(); st.Published != 6 || st.Pages != 3 {
		t.Fatalf("prefill's cache kept %d pages in all and holds %d, want the 3 decode holds kept again", st.Published, st.Pages)
	}
	before := p.prefixCache.Stats().HitTokens
	p.heldRun("acme", "", prompt)
	if hit := p.prefixCache.Stats().HitTokens - before; hit != 12 {
		t.Fatalf("the third request read %d prompt tokens from prefill's cache, want 12", hit)
	}
	if s := p.prefill.Stats(); s.Free+s.Cached != s.Capacity {
		t.Errorf("prefill pool: %d free and %d cached of %d", s.Free, s.Cached, s.Capacity)
	}
}

// TestHeldPagesPrefillDoesNotConfirmAreGivenUp: decode's copies of the
// pages it holds must have the rows the request's own prefill computed
// (TransferDone.HeldSums). A prefill that reports other rows (a faulty or
// hostile peer, or a decode cache that kept a faulty peer's rows) fails
// the request as an integrity error before decode reads a byte, and the
// cached pages go: which side is wrong cannot be told. A report with a
// checksum missing fails it too. Every page ends free or cached.
func TestHeldPagesPrefillDoesNotConfirmAreGivenUp(t *testing.T) {
	prompt := []int{engine.BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g', 'h', 'i', 'j', 'k', 'l', 'm', 'n'} // 3 full pages
	for _, c := range []struct {
		name   string
		tamper func(d *messages.TransferDone)
		want   any
		gone   uint64
	}{
		{"other rows", func(d *messages.TransferDone) { d.HeldSums[1] ^= 1 }, new(*kv.ChecksumMismatchError), 3},
		{"a checksum missing", func(d *messages.TransferDone) { d.HeldSums = d.HeldSums[:2] }, new(*kv.ManifestError), 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := newPair(t, 64, 64)
			p.withDecodeCache(32)
			p.heldRun("acme", "", prompt)
			held, _ := p.heldStart("acme", "", prompt, func(e Effect) {
				if r, ok := e.(Reply); ok && r.Done.Err == nil {
					c.tamper(r.Done)
				}
			})
			if held != 3 || p.finish == nil || !errors.As(p.finish.Cause, c.want) || len(p.tokens) != 0 {
				t.Fatalf("%d pages held; finish %+v, %d tokens; want 3 held and a %T before any token", held, p.finish, len(p.tokens), c.want)
			}
			if st := p.held.Stats(); st.Gone != c.gone || st.Pages != 3-int(c.gone) {
				t.Fatalf("the cache gave up %d pages and holds %d; want %d given up", st.Gone, st.Pages, c.gone)
			}
			if busy := p.freeAfterDeadlines(); busy != 3-int(c.gone) {
				t.Fatalf("%d pages neither free nor in the cache after the deadlines", busy-(3-int(c.gone)))
			}
		})
	}
}

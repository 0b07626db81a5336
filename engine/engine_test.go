package engine

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/kv"
)

var (
	ownerA  = kv.Owner{Request: 1, Tenant: "acme"}
	ownerB  = kv.Owner{Request: 2, Tenant: "acme"}
	ownerC  = kv.Owner{Request: 3, Tenant: "globex"}
	filler  = kv.Owner{Request: 99, Tenant: "filler"}
	epoch   = time.Unix(1_700_000_000, 0)
	tok     ByteTokenizer
	engines = map[ModelConfig]*ReferenceEngine{}
)

// engineFor builds each config's engine once per test binary: weights are
// the slow part of a small test.
func engineFor(t testing.TB, cfg ModelConfig) *ReferenceEngine {
	t.Helper()
	if e, ok := engines[cfg]; ok {
		return e
	}
	e, err := NewReferenceEngine(cfg)
	if err != nil {
		t.Fatal(err)
	}
	engines[cfg] = e
	return e
}

// testPrompt is n tokens (n ≥ 1): BOS, then text starting with salt, so
// that prompts of different salts differ from position 1 on, and so in
// every KV row after BOS's.
func testPrompt(n int, salt string) []int {
	s := salt + strings.Repeat(": the quick brown fox jumps over the lazy dog", n/40+1)
	return tok.Encode(s[:n-1])
}

// fragmentedPool is a pool whose free list is shuffled by seed and of which
// every third page is held by another request, so that a reservation gets
// pages out of order and never contiguous.
func fragmentedPool(t testing.TB, g kv.Geometry, pages int, incarnation, seed uint64) *kv.Pool {
	t.Helper()
	p, err := kv.NewPool(kv.DefaultConfig(g, pages, incarnation))
	if err != nil {
		t.Fatal(err)
	}
	tags, err := p.Reserve(filler, 0, pages, epoch)
	if err != nil {
		t.Fatal(err)
	}
	rng := splitMix64(seed)
	for i := len(tags) - 1; i > 0; i-- {
		j := int(rng.next() % uint64(i+1))
		tags[i], tags[j] = tags[j], tags[i]
	}
	for i, tag := range tags {
		if i%3 == 0 {
			continue
		}
		if _, err := p.Release(tag, filler, epoch); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func reserve(t testing.TB, p *kv.Pool, o kv.Owner, first, n int) []kv.Tag {
	t.Helper()
	tags, err := p.Reserve(o, first, n, epoch)
	if err != nil {
		t.Fatal(err)
	}
	return tags
}

// prefill reserves the prompt's pages for o and prefills them.
func prefill(t testing.TB, e Engine, p *kv.Pool, o kv.Owner, prompt []int) Prefilled {
	t.Helper()
	g := p.Config().Geometry
	pf, err := e.Prefill(p, o, reserve(t, p, o, 0, g.PagesFor(len(prompt))), prompt)
	if err != nil {
		t.Fatal(err)
	}
	return pf
}

// decode generates until it has maxNew tokens (First included), granting a
// fresh page whenever the sequence asks, then closes the sequence and
// checks that the pages it sealed verify as a manifest.
func decode(t testing.TB, e Engine, p *kv.Pool, m *kv.Manifest, first, maxNew int) []int {
	t.Helper()
	s, err := e.Decode(p, m, first)
	if err != nil {
		t.Fatal(err)
	}
	out := []int{first}
	for len(out) < maxNew {
		if at, need := s.NeedsPage(); need {
			if err := s.GrantPage(reserve(t, p, m.Owner, at, 1)[0]); err != nil {
				t.Fatal(err)
			}
		}
		next, err := s.Step(p)
		if err != nil {
			t.Fatalf("step at %d tokens: %v", s.Tokens(), err)
		}
		out = append(out, next)
	}
	if want := len(m.Pages) + (s.Tokens()-m.Tokens)/p.Config().Geometry.PageTokens; len(s.Manifest().Pages) != want {
		t.Fatalf("sequence sealed %d pages, want %d", len(s.Manifest().Pages), want)
	}
	if err := s.Manifest().Verify(p); err != nil {
		t.Fatalf("manifest of the sequence: %v", err)
	}
	if err := s.Close(p); err != nil {
		t.Fatal(err)
	}
	return out
}

// releaseAll gives back every page o holds and checks that no page is left
// leased: the sequence's Close gave back all its leases.
func releaseAll(t testing.TB, p *kv.Pool, o kv.Owner) {
	t.Helper()
	for i := range p.Config().Pages {
		info := p.Inspect(uint32(i))
		if info.State == kv.Free || info.Owner != o {
			continue
		}
		if freed, err := p.Release(info.Tag, o, epoch); err != nil || !freed {
			t.Fatalf("release of %s (%s, %d readers): freed %t, %v", info.Tag, info.State, info.Readers, freed, err)
		}
	}
}

func reference(t testing.TB, e *ReferenceEngine, prompt []int, maxNew int) []int {
	t.Helper()
	want, err := e.Reference(prompt, maxNew)
	if err != nil {
		t.Fatal(err)
	}
	return want
}

func TestPagedDecodeEqualsReference(t *testing.T) {
	for _, pt := range []int{4, 16} {
		for _, n := range []int{1, pt - 1, pt, pt + 1, 200} {
			t.Run(fmt.Sprintf("page=%d/prompt=%d", pt, n), func(t *testing.T) {
				e := engineFor(t, DefaultModelConfig())
				prompt, maxNew := testPrompt(n, "paged"), 3*pt+2
				p := fragmentedPool(t, e.Config().Geometry(pt), 256, 7, uint64(n))
				pf := prefill(t, e, p, ownerA, prompt)
				got := decode(t, e, p, pf.Manifest, pf.First, maxNew)
				if want := reference(t, e, prompt, maxNew); !slices.Equal(got, want) {
					t.Fatalf("paged decode differs from the reference:\n got %v\nwant %v", got, want)
				}
				releaseAll(t, p, ownerA)
				if st := p.Stats(); st.Refused.Total() != 0 {
					t.Fatalf("pool refused %+v on the checked path", st.Refused)
				}
			})
		}
	}
}

// TestFirstRecomputedFromKV: a sequence recomputes, from the prompt's KV
// and its last token, exactly the first token prefill found, for prompts
// across page boundaries and in 16-bit KV; another last token is refused
// (its KV row is not the one held), and so is a recomputation after a
// step.
func TestFirstRecomputedFromKV(t *testing.T) {
	for _, dt := range []kv.DType{kv.F32, kv.F16} {
		for _, n := range []int{1, 15, 16, 17, 120} {
			t.Run(fmt.Sprintf("%s/prompt=%d", dt, n), func(t *testing.T) {
				cfg := DefaultModelConfig()
				cfg.KVDType = dt
				e := engineFor(t, cfg)
				prompt := testPrompt(n, "first")
				p := fragmentedPool(t, cfg.Geometry(16), 64, 5, uint64(n))
				pf := prefill(t, e, p, ownerA, prompt)
				s, err := e.Decode(p, pf.Manifest, pf.First)
				if err != nil {
					t.Fatal(err)
				}
				if got, err := s.First(p, prompt[n-1]); err != nil || got != pf.First {
					t.Fatalf("first token recomputed: %d, %v; prefill found %d", got, err, pf.First)
				}
				if got, err := s.First(p, prompt[n-1]^1); err == nil {
					t.Fatalf("another last token gave %d and no error", got)
				}
				if _, err := s.Step(p); err != nil {
					t.Fatal(err)
				}
				if _, err := s.First(p, prompt[n-1]); err == nil {
					t.Fatal("first token recomputed after a step")
				}
				if err := s.Close(p); err != nil {
					t.Fatal(err)
				}
			})
		}
	}
}

// TestPagedDecodeEqualsReferenceHalf runs the paged path with KV stored in
// 16-bit types: the reference must round the same way.
func TestPagedDecodeEqualsReferenceHalf(t *testing.T) {
	for _, dt := range []kv.DType{kv.F16, kv.BF16} {
		t.Run(dt.String(), func(t *testing.T) {
			cfg := DefaultModelConfig()
			cfg.KVDType = dt
			e := engineFor(t, cfg)
			prompt := testPrompt(37, "half")
			p := fragmentedPool(t, cfg.Geometry(8), 64, 3, 5)
			pf := prefill(t, e, p, ownerA, prompt)
			got := decode(t, e, p, pf.Manifest, pf.First, 20)
			if want := reference(t, e, prompt, 20); !slices.Equal(got, want) {
				t.Fatalf("paged %s decode differs from the reference:\n got %v\nwant %v", dt, got, want)
			}
		})
	}
}

// TestTransferAcrossPools computes KV in one pool, moves it page by page
// through encoded frames into shuffled pages of a pool of another
// incarnation, and decodes there: the answer must not move by one bit.
func TestTransferAcrossPools(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(16)
	prompt := testPrompt(77, "transfer")
	src := fragmentedPool(t, g, 64, 0x1111, 1)
	pf := prefill(t, e, src, ownerA, prompt)

	dst := fragmentedPool(t, g, 64, 0x2222, 2)
	dstTags := reserve(t, dst, ownerA, 0, len(pf.Manifest.Pages))
	m, err := kv.NewManifest(ownerA, pf.Manifest.Tokens, g.PageTokens, dstTags)
	if err != nil {
		t.Fatal(err)
	}
	var wire []byte
	for i, sp := range pf.Manifest.Pages {
		l, err := src.Lease(sp.Tag, ownerA)
		if err != nil {
			t.Fatal(err)
		}
		payload, n, err := src.Read(l)
		if err != nil {
			t.Fatal(err)
		}
		wire, _, err = kv.AppendFrame(wire[:0], &kv.Frame{Owner: ownerA, Source: sp.Tag, Dest: dstTags[i],
			FirstToken: src.Inspect(sp.Tag.Index).First, Tokens: n, Payload: payload}, g.Limits())
		if err != nil {
			t.Fatal(err)
		}
		if err := src.Unlease(l); err != nil {
			t.Fatal(err)
		}
		f, _, err := kv.DecodeFrame(wire, g.Limits())
		if err != nil {
			t.Fatal(err)
		}
		if err := dst.Accept(&f); err != nil {
			t.Fatal(err)
		}
		if m.Pages[i].Checksum, err = dst.Seal(dstTags[i], ownerA); err != nil {
			t.Fatal(err)
		}
	}
	releaseAll(t, src, ownerA)

	got := decode(t, e, dst, m, pf.First, 40)
	if want := reference(t, e, prompt, 40); !slices.Equal(got, want) {
		t.Fatalf("decode after transfer differs from the reference:\n got %v\nwant %v", got, want)
	}
}

// TestForeignPageChangesAnswer plants request B's page in request A's
// sequence behind the pool's back and checks that the answer changes — the
// engine really reads the KV, so a stale or foreign page cannot go unseen —
// and that every checked way to do the same is refused.
func TestForeignPageChangesAnswer(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(16)
	p := fragmentedPool(t, g, 64, 9, 3)
	promptA, promptB := testPrompt(40, "alpha"), testPrompt(40, "bravo")
	pfA := prefill(t, e, p, ownerA, promptA)
	pfB := prefill(t, e, p, ownerB, promptB)
	pfC := prefill(t, e, p, ownerC, testPrompt(40, "charlie"))
	clean := decode(t, e, p, pfA.Manifest, pfA.First, 16)

	for page := range pfA.Manifest.Pages {
		t.Run(fmt.Sprintf("page=%d", page), func(t *testing.T) {
			s, err := e.Decode(p, pfA.Manifest, pfA.First)
			if err != nil {
				t.Fatal(err)
			}
			seq := s.(*refSequence)
			foreign, err := p.Lease(pfB.Manifest.Pages[page].Tag, ownerB)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Unlease(seq.leases[page]); err != nil {
				t.Fatal(err)
			}
			seq.leases[page], seq.pages[page] = foreign, pfB.Manifest.Pages[page]
			got := []int{pfA.First}
			for len(got) < len(clean) {
				next, err := s.Step(p)
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, next)
			}
			if err := s.Close(p); err != nil {
				t.Fatal(err)
			}
			if slices.Equal(got, clean) {
				t.Fatalf("request B's page %d in place of A's left the answer unchanged: %v", page, got)
			}
		})
	}

	for _, tc := range []struct {
		name    string
		foreign kv.ManifestPage
		check   func(error) bool
	}{
		{"same tenant", pfB.Manifest.Pages[1], func(err error) bool { var w *kv.WrongOwnerError; return errors.As(err, &w) }},
		{"other tenant", pfC.Manifest.Pages[1], func(err error) bool { var w *kv.WrongTenantError; return errors.As(err, &w) }},
	} {
		t.Run("checked/"+tc.name, func(t *testing.T) {
			swapped := *pfA.Manifest
			swapped.Pages = slices.Clone(pfA.Manifest.Pages)
			swapped.Pages[1] = tc.foreign
			if err := swapped.Verify(p); !tc.check(err) {
				t.Fatalf("Verify of a manifest naming a foreign page: %v", err)
			}
			if _, err := e.Decode(p, &swapped, pfA.First); !tc.check(err) {
				t.Fatalf("Decode of a manifest naming a foreign page: %v", err)
			}
			if _, err := p.Lease(tc.foreign.Tag, ownerA); !tc.check(err) {
				t.Fatalf("Lease of a foreign page: %v", err)
			}
		})
	}
	if st := p.Stats(); st.Leased != 0 {
		t.Fatalf("%d pages left leased", st.Leased)
	}
}

func TestPrefillRefusesBadTags(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(4)
	prompt := testPrompt(10, "stale")

	t.Run("stale", func(t *testing.T) {
		p := fragmentedPool(t, g, 32, 4, 4)
		tags := reserve(t, p, ownerA, 0, 3)
		if _, err := p.Release(tags[1], ownerA, epoch); err != nil {
			t.Fatal(err)
		}
		_, err := e.Prefill(p, ownerA, tags, prompt)
		var stale *kv.StaleTagError
		if !errors.As(err, &stale) || stale.Have != tags[1] || !errors.Is(err, kv.ErrRefused) {
			t.Fatalf("prefill with a released tag: %v", err)
		}
	})
	t.Run("other incarnation", func(t *testing.T) {
		p := fragmentedPool(t, g, 32, 4, 4)
		tags := reserve(t, p, ownerA, 0, 3)
		tags[2].Incarnation++
		var stale *kv.StaleTagError
		if _, err := e.Prefill(p, ownerA, tags, prompt); !errors.As(err, &stale) {
			t.Fatalf("prefill with another incarnation's tag: %v", err)
		}
	})
	t.Run("foreign", func(t *testing.T) {
		p := fragmentedPool(t, g, 32, 4, 4)
		tags := append(reserve(t, p, ownerA, 0, 2), reserve(t, p, ownerC, 8, 1)...)
		var wrong *kv.WrongTenantError
		if _, err := e.Prefill(p, ownerA, tags, prompt); !errors.As(err, &wrong) {
			t.Fatalf("prefill into another tenant's page: %v", err)
		}
	})
	t.Run("count", func(t *testing.T) {
		p := fragmentedPool(t, g, 32, 4, 4)
		var me *kv.ManifestError
		if _, err := e.Prefill(p, ownerA, reserve(t, p, ownerA, 0, 2), prompt); !errors.As(err, &me) {
			t.Fatalf("prefill of 3 pages into 2 tags: %v", err)
		}
	})
}

func TestEngineRefusesBadInput(t *testing.T) {
	cfg := DefaultModelConfig()
	cfg.ContextTokens = 64 // a full context stays quick to prefill
	e := engineFor(t, cfg)
	p := fragmentedPool(t, cfg.Geometry(16), 256, 5, 5)
	tags := reserve(t, p, ownerA, 0, 1)
	if _, err := e.Prefill(p, ownerA, tags, nil); !errors.Is(err, ErrEmptyPrompt) {
		t.Errorf("empty prompt: %v", err)
	}
	var te *TokenError
	if _, err := e.Prefill(p, ownerA, tags, []int{1, cfg.Vocab}); !errors.As(err, &te) || te.Index != 1 || te.Vocab != cfg.Vocab {
		t.Errorf("token past the vocabulary: %v", err)
	}
	if _, err := e.Prefill(p, ownerA, tags, []int{-1}); !errors.As(err, &te) {
		t.Errorf("negative token: %v", err)
	}
	var ce *ContextFullError
	if _, err := e.Prefill(p, ownerA, tags, make([]int, cfg.ContextTokens+1)); !errors.As(err, &ce) || ce.Limit != cfg.ContextTokens {
		t.Errorf("prompt over the context: %v", err)
	}
	if _, err := e.Reference(make([]int, cfg.ContextTokens), 2); !errors.As(err, &ce) || ce.Tokens != cfg.ContextTokens+1 {
		t.Errorf("reference past the context: %v", err)
	}
	if _, err := e.Reference([]int{1}, 0); err == nil {
		t.Error("reference of no tokens accepted")
	}
	var ge *GeometryError
	if _, err := engineFor(t, DefaultModelConfig()).Prefill(p, ownerA, tags, []int{1}); err != nil {
		t.Errorf("pool of the same geometry under another context window: %v", err)
	}
	if _, err := engineFor(t, LargeModelConfig()).Prefill(p, ownerA, tags, []int{1}); !errors.As(err, &ge) {
		t.Errorf("pool of another model's geometry: %v", err)
	}
	pf := prefill(t, e, p, ownerB, make([]int, cfg.ContextTokens))
	if _, err := e.Decode(p, pf.Manifest, pf.First); !errors.As(err, &ce) {
		t.Errorf("decode of a full context: %v", err)
	}
	if _, err := e.Decode(p, pf.Manifest, -1); !errors.As(err, &te) {
		t.Errorf("decode from a negative token: %v", err)
	}
	if st := p.Stats(); st.Filling != 0 || st.Leased != 0 {
		t.Errorf("a refused call left pages filling or leased: %+v", st)
	}
}

// TestSequenceGrants checks the page handshake of decode: a full tail
// without a granted page refuses the step and changes nothing; a granted
// page that the pool refuses is dropped and the step can be retried; the
// answer is the reference's all the same.
func TestSequenceGrants(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(4)
	p := fragmentedPool(t, g, 64, 6, 6)
	prompt := testPrompt(6, "grant")
	pf := prefill(t, e, p, ownerA, prompt)
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	got := []int{pf.First}
	step := func() {
		t.Helper()
		next, err := s.Step(p)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, next)
	}
	for range 4 {
		if _, need := s.NeedsPage(); need {
			t.Fatalf("needs a page at %d tokens with the tail not full", s.Tokens())
		}
		step()
	}
	at, need := s.NeedsPage()
	if !need || at != 6 {
		t.Fatalf("tail of %d tokens full: needs page %t from position %d, want from 6", g.PageTokens, need, at)
	}
	var needErr *NeedPageError
	if _, err := s.Step(p); !errors.As(err, &needErr) || s.Tokens() != 10 {
		t.Fatalf("step without a page: %v at %d tokens", err, s.Tokens())
	}
	// Each refused grant must leave the sequence where it was, wanting a
	// page from the same position.
	stale := reserve(t, p, ownerA, at, 1)[0]
	if _, err := p.Release(stale, ownerA, epoch); err != nil {
		t.Fatal(err)
	}
	var staleErr *kv.StaleTagError
	var rangeErr *kv.TokenRangeError
	var tenantErr *kv.WrongTenantError
	for _, bad := range []struct {
		tag   kv.Tag
		check func(error) bool
	}{
		{stale, func(err error) bool { return errors.As(err, &staleErr) }},
		{reserve(t, p, ownerA, at+g.PageTokens, 1)[0], func(err error) bool { return errors.As(err, &rangeErr) }},
		{reserve(t, p, ownerC, at, 1)[0], func(err error) bool { return errors.As(err, &tenantErr) }},
	} {
		if err := s.GrantPage(bad.tag); err != nil {
			t.Fatal(err)
		}
		if err := s.GrantPage(bad.tag); err == nil {
			t.Fatal("second grant accepted")
		}
		_, err := s.Step(p)
		if again, need := s.NeedsPage(); !bad.check(err) || !need || again != at || s.Tokens() != 10 {
			t.Fatalf("step with bad page %s: %v; then needs page %t from %d at %d tokens", bad.tag, err, need, again, s.Tokens())
		}
	}
	if err := s.GrantPage(reserve(t, p, ownerA, at, 1)[0]); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		step()
		if at, need := s.NeedsPage(); need {
			if err := s.GrantPage(reserve(t, p, ownerA, at, 1)[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Close(p); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Step(p); !errors.Is(err, ErrSequenceClosed) {
		t.Fatalf("step after close: %v", err)
	}
	if want := reference(t, e, prompt, len(got)); !slices.Equal(got, want) {
		t.Fatalf("decode with refused grants differs from the reference:\n got %v\nwant %v", got, want)
	}
}

// TestReclaimedPageFailsStep: once the pool reclaims a page under a
// sequence, the next step is refused instead of reading whatever the page
// holds by then.
func TestReclaimedPageFailsStep(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	p := fragmentedPool(t, e.Config().Geometry(4), 32, 8, 8)
	pf := prefill(t, e, p, ownerA, testPrompt(9, "reclaim"))
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Step(p); err != nil {
		t.Fatal(err)
	}
	if freed, err := p.Release(pf.Manifest.Pages[1].Tag, ownerA, epoch); err != nil || freed {
		t.Fatalf("release of a leased page: freed %t, %v", freed, err)
	}
	p.Tick(epoch.Add(time.Hour))
	var stale *kv.StaleTagError
	if _, err := s.Step(p); !errors.As(err, &stale) {
		t.Fatalf("step over a reclaimed page: %v", err)
	}
}

func TestStepAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates; go test without -race counts")
	}
	e := engineFor(t, DefaultModelConfig())
	p := fragmentedPool(t, e.Config().Geometry(128), 8, 10, 10)
	pf := prefill(t, e, p, ownerA, testPrompt(20, "alloc"))
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(50, func() {
		if _, err := s.Step(p); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Fatalf("a step allocates %v times", n)
	}
}

// TestReferenceNotDegenerate guards the weight scales: greedy decoding of
// random weights easily collapses into one token repeated, or ignores the
// prompt, and then a wrong KV page could not show in the answer.
func TestReferenceNotDegenerate(t *testing.T) {
	for _, cfg := range []ModelConfig{DefaultModelConfig(), LargeModelConfig()} {
		e := engineFor(t, cfg)
		seen := map[string]bool{}
		for _, s := range []string{"a", "Hello, world", "The quick brown fox jumps over the lazy dog"} {
			out := reference(t, e, tok.Encode(s), 48)
			distinct := map[int]bool{}
			for _, id := range out {
				distinct[id] = true
			}
			if len(distinct) < 16 {
				t.Errorf("%d layers: %q gives only %d distinct tokens in 48: %v", cfg.Layers, s, len(distinct), out)
			}
			seen[fmt.Sprint(out)] = true
		}
		if len(seen) != 3 {
			t.Errorf("%d layers: different prompts give the same answer", cfg.Layers)
		}
	}
	cfg := DefaultModelConfig()
	cfg.Seed++
	prompt := tok.Encode("seed")
	if a, b := reference(t, engineFor(t, DefaultModelConfig()), prompt, 16), reference(t, engineFor(t, cfg), prompt, 16); slices.Equal(a, b) {
		t.Errorf("seeds %d and %d give the same answer %v", cfg.Seed-1, cfg.Seed, a)
	}
}

func TestReferenceDeterministic(t *testing.T) {
	prompt := tok.Encode("determinism")
	fresh, err := NewReferenceEngine(DefaultModelConfig()) // weights generated again
	if err != nil {
		t.Fatal(err)
	}
	a, err := fresh.Reference(prompt, 32)
	if err != nil {
		t.Fatal(err)
	}
	if b := reference(t, engineFor(t, DefaultModelConfig()), prompt, 32); !slices.Equal(a, b) {
		t.Fatalf("two models of one config disagree:\n%v\n%v", a, b)
	}
}

func TestModelConfigValidate(t *testing.T) {
	for _, cfg := range []ModelConfig{DefaultModelConfig(), LargeModelConfig()} {
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		edit func(*ModelConfig)
		want string
	}{
		{func(c *ModelConfig) { c.Vocab = 100 }, "Vocab (100)"},
		{func(c *ModelConfig) { c.Layers = 0 }, "Layers (0)"},
		{func(c *ModelConfig) { c.Dim = 1 << 20 }, "Dim (1048576)"},
		{func(c *ModelConfig) { c.KVHeads = 3 }, "Heads (4) must be a multiple of KVHeads (3)"},
		{func(c *ModelConfig) { c.HeadDim = 33 }, "HeadDim (33) must be even"},
		{func(c *ModelConfig) { c.RoPETheta = 0 }, "RoPETheta (0)"},
		{func(c *ModelConfig) { c.NormEps = math.NaN() }, "NormEps (NaN)"},
		{func(c *ModelConfig) { c.KVDType = 9 }, "KVDType (9)"},
		{func(c *ModelConfig) { c.ContextTokens = 0 }, "ContextTokens (0)"},
	} {
		cfg := DefaultModelConfig()
		tc.edit(&cfg)
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error naming %q, got %v", tc.want, err)
		}
		if _, err := NewReferenceEngine(cfg); err == nil {
			t.Errorf("engine built from an invalid config (%s)", tc.want)
		}
	}
	zero := DefaultModelConfig()
	zero.KVDType = 0
	if g := zero.Geometry(16); g.DType != kv.F32 {
		t.Errorf("zero KVDType gives %s, want f32", g.DType)
	}
}

// TestByteTokenizer: any string encodes as BOS and its bytes; a byte that
// is printable ASCII or a newline is its own piece, any other a printable
// stand-in of one byte.
func TestByteTokenizer(t *testing.T) {
	for _, s := range []string{"", "hello\n ~", "naïve ☃", "\x00\xff\xfe\x1b\x7f\t"} {
		ids := tok.Encode(s)
		if len(ids) != 1+len(s) || ids[0] != BOS {
			t.Fatalf("Encode(%q) = %v: want BOS and one id per byte", s, ids)
		}
		for i, id := range ids[1:] {
			p := tok.Piece(ids[i], id)
			printable := id == '\n' || id >= 0x20 && id <= 0x7e
			switch {
			case len(p) != 1:
				t.Errorf("Piece(%#x) = %q, want one byte", id, p)
			case printable && p[0] != byte(id):
				t.Errorf("Piece(%#x) = %q, want the byte itself", id, p)
			case !printable && (p[0] < '!' || p[0] > '~'):
				t.Errorf("Piece(%#x) = %q, want a printable stand-in", id, p)
			}
		}
	}
	for _, id := range []int{BOS, EOS, 300, -1} {
		if p := tok.Piece(BOS, id); p != nil {
			t.Errorf("Piece(%d) = %q, want nothing", id, p)
		}
	}
	if tok.Stop() != EOS || tok.BOS() != BOS || tok.Vocab() != TokenizerVocab {
		t.Errorf("specials: BOS %d, Stop %d, Vocab %d", tok.BOS(), tok.Stop(), tok.Vocab())
	}
}

func TestF16(t *testing.T) {
	for h := range 1 << 16 {
		f := f16ToF32(uint16(h))
		if f != f {
			if back := f32ToF16(f); back&0x7c00 != 0x7c00 || back&0x3ff == 0 {
				t.Fatalf("NaN %04x comes back as %04x", h, back)
			}
			continue
		}
		if back := f32ToF16(f); back != uint16(h) {
			t.Fatalf("%04x → %g → %04x", h, f, back)
		}
	}
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3c00}, {-2, 0xc000}, {65504, 0x7bff}, {65520, 0x7c00}, {1e10, 0x7c00},
		{0x1p-24, 0x0001}, {0x1p-25, 0x0000}, {0x1.8p-24, 0x0002}, {1 + 0x1p-11, 0x3c00},
		{1 + 0x3p-11, 0x3c02}, {0.1, 0x2e66}, {float32(math.Inf(-1)), 0xfc00},
	} {
		if got := f32ToF16(tc.f); got != tc.want {
			t.Errorf("f32ToF16(%g) = %04x, want %04x", tc.f, got, tc.want)
		}
	}
}

func TestBF16(t *testing.T) {
	for _, tc := range []struct {
		f    float32
		want uint16
	}{
		{1, 0x3f80}, {-1, 0xbf80}, {math.Float32frombits(0x3f808000), 0x3f80},
		{math.Float32frombits(0x3f818000), 0x3f82}, {math.Float32frombits(0x3f808001), 0x3f81},
		{math.MaxFloat32, 0x7f80},
	} {
		if got := f32ToBF16(tc.f); got != tc.want {
			t.Errorf("f32ToBF16(%g) = %04x, want %04x", tc.f, got, tc.want)
		}
	}
	if nan := f32ToBF16(float32(math.NaN())); nan&0x7f80 != 0x7f80 || nan&0x7f == 0 {
		t.Errorf("NaN becomes %04x", nan)
	}
}

func TestExp32(t *testing.T) {
	for x := float32(-104); x < 89; x += 0.0137 {
		got, want := exp32(x), float32(math.Exp(float64(x)))
		if ulps := math.Float32bits(got) - math.Float32bits(want); got != want && ulps != 1 && ulps != math.MaxUint32 {
			t.Fatalf("exp32(%g) = %g, math.Exp gives %g", x, got, want)
		}
	}
	if exp32(-200) != 0 || !math.IsInf(float64(exp32(200)), 1) || exp32(0) != 1 {
		t.Fatalf("exp32 limits: %g %g %g", exp32(-200), exp32(200), exp32(0))
	}
}

// stepBatch steps seqs together, granting a fresh page to each that asks,
// and returns the outcomes.
func stepBatch(t testing.TB, p *kv.Pool, seqs []Sequence) ([]int, []error) {
	t.Helper()
	for _, s := range seqs {
		if at, need := s.NeedsPage(); need {
			if err := s.GrantPage(reserve(t, p, s.Manifest().Owner, at, 1)[0]); err != nil {
				t.Fatal(err)
			}
		}
	}
	toks, errs := make([]int, len(seqs)), make([]error, len(seqs))
	StepBatch(p, seqs, toks, errs)
	return toks, errs
}

// TestStepBatchEqualsReference decodes sequences of different prompt
// lengths together, across many page boundaries, each batch step computing
// them all in one pass: every sequence must give the reference's answer.
func TestStepBatchEqualsReference(t *testing.T) {
	for _, cfg := range []ModelConfig{DefaultModelConfig(), oddModelConfig()} {
		for _, dt := range []kv.DType{kv.F32, kv.BF16} {
			cfg.KVDType = dt
			t.Run(fmt.Sprintf("dim=%d/%s", cfg.Dim, dt), func(t *testing.T) {
				e := engineFor(t, cfg)
				p := fragmentedPool(t, cfg.Geometry(4), 512, 11, 12)
				lengths := []int{1, 3, 4, 7, 30, 61}
				var seqs []Sequence
				got := make([][]int, len(lengths))
				for i, n := range lengths {
					o := kv.Owner{Request: uint64(100 + i), Tenant: "batch"}
					pf := prefill(t, e, p, o, testPrompt(n, fmt.Sprint(i)))
					s, err := e.Decode(p, pf.Manifest, pf.First)
					if err != nil {
						t.Fatal(err)
					}
					seqs, got[i] = append(seqs, s), []int{pf.First}
				}
				const maxNew = 14
				for len(got[0]) < maxNew {
					toks, errs := stepBatch(t, p, seqs)
					for i := range seqs {
						if errs[i] != nil {
							t.Fatalf("sequence %d at %d tokens: %v", i, seqs[i].Tokens(), errs[i])
						}
						got[i] = append(got[i], toks[i])
					}
				}
				for i, n := range lengths {
					if want := reference(t, e, testPrompt(n, fmt.Sprint(i)), maxNew); !slices.Equal(got[i], want) {
						t.Errorf("sequence %d (prompt of %d) in a batch:\n got %v\nwant %v", i, n, got[i], want)
					}
					if err := seqs[i].Manifest().Verify(p); err != nil {
						t.Errorf("sequence %d: %v", i, err)
					}
					if err := seqs[i].Close(p); err != nil {
						t.Error(err)
					}
				}
			})
		}
	}
}

// TestStepBatchFailsAlone puts in one batch a sequence of each way a step
// fails (a full tail with no page, closed, a page reclaimed, the context
// full, given twice) next to two that are well: each failing one gets the
// error its Step gives and is left as it was, the others step, and all
// that can go on end with the reference's answer. The sequences at a
// context of 40 are another engine's, which steps in a pass of its own.
func TestStepBatchFailsAlone(t *testing.T) {
	cfg := DefaultModelConfig()
	short := cfg
	short.ContextTokens = 40
	e, es := engineFor(t, cfg), engineFor(t, short)
	p := fragmentedPool(t, cfg.Geometry(4), 256, 13, 14)
	type seq struct {
		e      *ReferenceEngine
		prompt []int
		s      Sequence
		got    []int
	}
	start := func(e *ReferenceEngine, n int, salt string, req uint64) *seq {
		prompt := testPrompt(n, salt)
		pf := prefill(t, e, p, kv.Owner{Request: req, Tenant: "fail"}, prompt)
		s, err := e.Decode(p, pf.Manifest, pf.First)
		if err != nil {
			t.Fatal(err)
		}
		return &seq{e: e, prompt: prompt, s: s, got: []int{pf.First}}
	}
	well, noPage, closed := start(e, 9, "well", 1), start(e, 8, "nopage", 2), start(e, 5, "closed", 3)
	reclaimed, full, shortWell := start(e, 10, "reclaim", 4), start(es, 39, "full", 5), start(es, 20, "short", 6)
	// Four steps fill each tail; full steps once, to the end of its context.
	for range 4 {
		for _, q := range []*seq{well, noPage, closed, reclaimed, full, shortWell} {
			if q == full && len(q.got) > 1 {
				continue
			}
			next, err := q.s.Step(p)
			if err != nil {
				t.Fatal(err)
			}
			q.got = append(q.got, next)
		}
	}
	if err := closed.s.Close(p); err != nil {
		t.Fatal(err)
	}
	if freed, err := p.Release(reclaimed.s.Manifest().Pages[0].Tag, reclaimed.s.Manifest().Owner, epoch); err != nil || freed {
		t.Fatalf("release of a leased page: freed %t, %v", freed, err)
	}
	// Past the released page's reclaim delay, before any owned page's.
	p.Tick(epoch.Add(time.Minute))
	// Every tail is full: all but noPage get the page they ask for.
	for _, q := range []*seq{well, reclaimed, shortWell} {
		at, need := q.s.NeedsPage()
		if !need {
			t.Fatalf("a full tail at %d tokens needs no page", q.s.Tokens())
		}
		if err := q.s.GrantPage(reserve(t, p, q.s.Manifest().Owner, at, 1)[0]); err != nil {
			t.Fatal(err)
		}
	}

	batch := []Sequence{well.s, noPage.s, closed.s, reclaimed.s, full.s, well.s, shortWell.s}
	before := make([]int, len(batch))
	for i, s := range batch {
		before[i] = s.Tokens()
	}
	toks, errs := make([]int, len(batch)), make([]error, len(batch))
	StepBatch(p, batch, toks, errs)
	var needPage *NeedPageError
	var stale *kv.StaleTagError
	var ctxFull *ContextFullError
	for i, c := range []struct {
		name string
		ok   func(error) bool
	}{
		{"well", func(err error) bool { return err == nil }},
		{"no page", func(err error) bool { return errors.As(err, &needPage) }},
		{"closed", func(err error) bool { return errors.Is(err, ErrSequenceClosed) }},
		{"reclaimed", func(err error) bool { return errors.As(err, &stale) }},
		{"context full", func(err error) bool { return errors.As(err, &ctxFull) && ctxFull.Limit == 40 }},
		{"twice", func(err error) bool { return errors.Is(err, ErrSequenceTwice) }},
		{"short well", func(err error) bool { return err == nil }},
	} {
		if !c.ok(errs[i]) {
			t.Errorf("%s: %v", c.name, errs[i])
		}
		stepped := 0
		if errs[i] == nil {
			stepped = 1
		}
		if c.name != "twice" && batch[i].Tokens() != before[i]+stepped {
			t.Errorf("%s: %d tokens after the batch, %d before", c.name, batch[i].Tokens(), before[i])
		}
	}
	if well.s.Tokens() != before[0]+1 {
		t.Errorf("a sequence given twice stepped to %d tokens from %d", well.s.Tokens(), before[0])
	}
	well.got = append(well.got, toks[0])
	shortWell.got = append(shortWell.got, toks[6])
	// The page the failed sequence asked for lets it go on, in a batch with
	// the others that can.
	if at, need := noPage.s.NeedsPage(); !need {
		t.Fatal("the sequence refused for want of a page needs none")
	} else if err := noPage.s.GrantPage(reserve(t, p, noPage.s.Manifest().Owner, at, 1)[0]); err != nil {
		t.Fatal(err)
	}
	live := []*seq{well, noPage, shortWell}
	for len(well.got) < 16 {
		seqs := []Sequence{well.s, noPage.s, shortWell.s}
		toks, errs := stepBatch(t, p, seqs)
		for i, q := range live {
			if errs[i] != nil {
				t.Fatalf("sequence %d: %v", i, errs[i])
			}
			q.got = append(q.got, toks[i])
		}
	}
	for _, q := range live {
		if want := reference(t, q.e, q.prompt, len(q.got)); !slices.Equal(q.got, want) {
			t.Errorf("prompt of %d tokens:\n got %v\nwant %v", len(q.prompt), q.got, want)
		}
	}
}

func TestStepBatchAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's instrumentation allocates; go test without -race counts")
	}
	e := engineFor(t, DefaultModelConfig())
	p := fragmentedPool(t, e.Config().Geometry(128), 32, 10, 10)
	var seqs []Sequence
	for i := range 4 {
		o := kv.Owner{Request: uint64(10 + i), Tenant: "alloc"}
		pf := prefill(t, e, p, o, testPrompt(20+i, "alloc"))
		s, err := e.Decode(p, pf.Manifest, pf.First)
		if err != nil {
			t.Fatal(err)
		}
		seqs = append(seqs, s)
	}
	toks, errs := make([]int, len(seqs)), make([]error, len(seqs))
	if n := testing.AllocsPerRun(50, func() {
		StepBatch(p, seqs, toks, errs)
		for _, err := range errs {
			if err != nil {
				t.Fatal(err)
			}
		}
	}); n != 0 {
		t.Fatalf("a batch step allocates %v times", n)
	}
}

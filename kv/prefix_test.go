package kv

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"

	"pgregory.net/rapid"
)

const testModel = "sha256:0123"

func testRoot(t *testing.T, scope Scope, model string, g Geometry) PrefixKey {
	t.Helper()
	k, err := PrefixRoot(scope, model, g)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestPrefixRootBindsEverything: changing any one input of the root, or
// moving bytes from one string input to the next, gives another key.
func TestPrefixRootBindsEverything(t *testing.T) {
	mine := TenantScope("alice")
	roots := map[PrefixKey]string{}
	add := func(what string, scope Scope, model string, g Geometry) {
		k := testRoot(t, scope, model, g)
		if other, ok := roots[k]; ok {
			t.Fatalf("%s and %s have the same root %s", what, other, k)
		}
		roots[k] = what
	}
	g := testGeom
	add("the base", mine, testModel, g)
	add("another tenant", TenantScope("bob"), testModel, g)
	add("a group of the tenant's name", SharedScope("alice"), testModel, g)
	add("a narrowed scope", mine.Narrow("s1"), testModel, g)
	add("another narrowing", mine.Narrow("s2"), testModel, g)
	add("another model", mine, "sha256:0124", g)
	add("a byte moved from scope to model", TenantScope("alic"), "e"+testModel, g)
	for _, f := range []struct {
		name string
		set  func(g *Geometry)
	}{
		{"Layers", func(g *Geometry) { g.Layers++ }},
		{"KVHeads", func(g *Geometry) { g.KVHeads++ }},
		{"HeadDim", func(g *Geometry) { g.HeadDim++ }},
		{"PageTokens", func(g *Geometry) { g.PageTokens++ }},
		{"DType f16", func(g *Geometry) { g.DType = F16 }},
		{"DType bf16", func(g *Geometry) { g.DType = BF16 }},
	} {
		g := testGeom
		f.set(&g)
		add("another "+f.name, mine, testModel, g)
	}
	if k := testRoot(t, mine, testModel, testGeom); roots[k] != "the base" {
		t.Fatalf("the same inputs gave root %s, not the base's", k)
	}
}

func TestPrefixRootRefusals(t *testing.T) {
	bad := testGeom
	bad.PageTokens = 0
	for _, tc := range []struct {
		name  string
		scope Scope
		model string
		g     Geometry
	}{
		{"the zero scope", Scope{}, testModel, testGeom},
		{"a scope narrowed past its bound", TenantScope("alice").Narrow(string(make([]byte, ScopeBytesMax))), testModel, testGeom},
		{"no model fingerprint", TenantScope("alice"), "", testGeom},
		{"an invalid geometry", TenantScope("alice"), testModel, bad},
	} {
		if k, err := PrefixRoot(tc.scope, tc.model, tc.g); err == nil {
			t.Errorf("%s: root %s, want a refusal", tc.name, k)
		}
	}
}

// TestPrefixKeyChain: a page's key depends on its parent and on each of
// its tokens, and on where the page boundaries fall.
func TestPrefixKeyChain(t *testing.T) {
	root := testRoot(t, TenantScope("alice"), testModel, testGeom)
	other := testRoot(t, TenantScope("bob"), testModel, testGeom)
	keys := map[PrefixKey]string{root: "the root", other: "another root"}
	add := func(what string, k PrefixKey) {
		if prev, ok := keys[k]; ok {
			t.Fatalf("%s and %s have the same key %s", what, prev, k)
		}
		keys[k] = what
	}
	add("page [1 2 3 4]", root.Next([]int{1, 2, 3, 4}))
	add("its tokens under another root", other.Next([]int{1, 2, 3, 4}))
	for i := range 4 {
		tokens := []int{1, 2, 3, 4}
		tokens[i] = 9
		add(fmt.Sprintf("token %d changed", i), root.Next(tokens))
	}
	add("a token missing", root.Next([]int{1, 2, 3}))
	add("no tokens", root.Next(nil))
	add("token -1", root.Next([]int{-1}))
	add("token 2^32-1", root.Next([]int{1<<32 - 1}))
	add("[1 2] then [3]", root.Next([]int{1, 2}).Next([]int{3}))
	add("[1] then [2 3]", root.Next([]int{1}).Next([]int{2, 3}))
	add("[1 2 3] then [5]", root.Next([]int{1, 2, 3}).Next([]int{5}))
	add("[1 2 9] then [5]", root.Next([]int{1, 2, 9}).Next([]int{5}))
	if k := root.Next([]int{1, 2, 3, 4}); keys[k] != "page [1 2 3 4]" {
		t.Fatalf("the same page gave key %s", k)
	}
}

// TestPrefixKeys: a prompt has a key for each full page but the one with
// its last token, and each key is its page's in the chain.
func TestPrefixKeys(t *testing.T) {
	root := testRoot(t, TenantScope("alice"), testModel, testGeom)
	prompt := make([]int, 13)
	for i := range prompt {
		prompt[i] = 100 + i
	}
	for _, tc := range []struct{ tokens, keys int }{
		{0, 0}, {1, 0}, {4, 0}, {5, 1}, {8, 1}, {9, 2}, {12, 2}, {13, 3},
	} {
		keys := PrefixKeys(root, prompt[:tc.tokens], 4)
		if len(keys) != tc.keys {
			t.Fatalf("a %d-token prompt of 4-token pages: %d keys, want %d", tc.tokens, len(keys), tc.keys)
		}
		k := root
		for i, got := range keys {
			if k = k.Next(prompt[i*4 : i*4+4]); got != k {
				t.Fatalf("a %d-token prompt: key %d is %s, want %s", tc.tokens, i, got, k)
			}
		}
	}
	changed := slices.Clone(prompt)
	changed[0]++
	a, b := PrefixKeys(root, prompt, 4), PrefixKeys(root, changed, 4)
	for i := range a {
		if a[i] == b[i] {
			t.Fatalf("key %d does not depend on token 0", i)
		}
	}
	defer func() {
		if recover() == nil {
			t.Fatal("keys of 0-token pages did not panic")
		}
	}()
	PrefixKeys(root, prompt, 0)
}

// indexTestPage is cached page i of a prompt: its tag's index is id, its
// first position i × PageTokens.
func indexTestPage(id uint32, i int) CachedPage {
	return CachedPage{Tag: Tag{Incarnation: testIncarnation, Index: id, Generation: 2}, Scope: TenantScope("alice"),
		First: i * testGeom.PageTokens, Tokens: testGeom.PageTokens}
}

func indexTestKey(id uint32) PrefixKey { return PrefixKey{byte(id), byte(id >> 8), 0xEE} }

func newTestIndex(t *testing.T, pages int) *PrefixIndex {
	t.Helper()
	x, err := NewPrefixIndex(pages)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func mustAdd(t *testing.T, x *PrefixIndex, id uint32, i int) {
	t.Helper()
	if err := x.Add(indexTestKey(id), indexTestPage(id, i)); err != nil {
		t.Fatal(err)
	}
}

func indexes(pages []CachedPage) []uint32 {
	out := make([]uint32, len(pages))
	for i, c := range pages {
		out[i] = c.Tag.Index
	}
	return out
}

func TestPrefixIndexMatchStopsAtGap(t *testing.T) {
	x := newTestIndex(t, 8)
	for i, id := range []uint32{10, 11, 13} { // page 2 (12) is missing
		mustAdd(t, x, id, []int{0, 1, 3}[i])
	}
	keys := []PrefixKey{indexTestKey(10), indexTestKey(11), indexTestKey(12), indexTestKey(13)}
	for _, tc := range []struct {
		from int
		want []uint32
	}{{0, []uint32{10, 11}}, {1, []uint32{11}}, {2, nil}, {3, []uint32{13}}} {
		if got := indexes(x.Match(keys[tc.from:])); !slices.Equal(got, tc.want) {
			t.Fatalf("match from key %d: pages %v, want %v", tc.from, got, tc.want)
		}
	}
	if !x.Has(indexTestKey(13)) || x.Has(indexTestKey(12)) {
		t.Fatal("Has disagrees with what was added")
	}
}

// TestPrefixIndexVictimsOrder: least recently used first; among pages of
// one use, the deepest first; among pages of one use and depth, the first
// added first.
func TestPrefixIndexVictimsOrder(t *testing.T) {
	x := newTestIndex(t, 10)
	x.Match([]PrefixKey{indexTestKey(1)}) // a miss, then prompt A's pages 0-2
	mustAdd(t, x, 1, 0)
	mustAdd(t, x, 2, 1)
	mustAdd(t, x, 3, 2)
	x.Match([]PrefixKey{indexTestKey(4)}) // a miss, then prompt B's pages 0-1 and C's page 0
	mustAdd(t, x, 4, 0)
	mustAdd(t, x, 5, 1)
	mustAdd(t, x, 6, 0)
	x.Match([]PrefixKey{indexTestKey(1)}) // A's page 0 alone is used again
	if got, want := indexes(x.Pages()), []uint32{3, 2, 5, 4, 6, 1}; !slices.Equal(got, want) {
		t.Fatalf("pages in LRU order %v, want %v", got, want)
	}
	if got, want := x.RecentKeys(4), []PrefixKey{indexTestKey(1), indexTestKey(6), indexTestKey(4), indexTestKey(5)}; !slices.Equal(got, want) {
		t.Fatalf("the 4 most recent keys %v, want %v", got, want)
	}
	if got := x.RecentKeys(100); len(got) != 6 {
		t.Fatalf("%d recent keys of 6 held", len(got))
	}
	if got := indexes(x.Victims(2)); !slices.Equal(got, []uint32{3, 2}) {
		t.Fatalf("first two victims %v, want A's pages 2 then 1", got)
	}
	x.Match([]PrefixKey{indexTestKey(4), indexTestKey(5)}) // B is used
	if got := indexes(x.Victims(10)); !slices.Equal(got, []uint32{6, 1, 5, 4}) {
		t.Fatalf("the rest %v, want C's page, A's page 0, then B's pages deepest first", got)
	}
	if x.Len() != 0 || x.Room() != 10 || x.Victims(1) != nil {
		t.Fatalf("after every victim: %d held, room %d", x.Len(), x.Room())
	}
}

// TestPrefixIndexVictimsBeforeSparesTheLatestUse: the pages a Match
// stamped, and those added since, are never given up by VictimsBefore of
// that use, however few the others.
func TestPrefixIndexVictimsBeforeSparesTheLatestUse(t *testing.T) {
	x := newTestIndex(t, 4)
	x.Match([]PrefixKey{indexTestKey(1)})
	mustAdd(t, x, 1, 0)
	mustAdd(t, x, 2, 1)
	x.Match([]PrefixKey{indexTestKey(3)})
	use := x.Uses()
	mustAdd(t, x, 3, 0)
	if got := indexes(x.VictimsBefore(3, use)); !slices.Equal(got, []uint32{2, 1}) {
		t.Fatalf("victims before the latest use %v, want the older prompt's pages, deepest first", got)
	}
	if got := x.VictimsBefore(3, use); got != nil || x.Len() != 1 {
		t.Fatalf("victims %v and %d held once only the latest use's page is left", got, x.Len())
	}
}

func TestPrefixIndexAddRefusals(t *testing.T) {
	x := newTestIndex(t, 2)
	mustAdd(t, x, 1, 0)
	var keyHeld *PrefixKeyHeldError
	err := x.Add(indexTestKey(1), indexTestPage(2, 0))
	if !errors.As(err, &keyHeld) || keyHeld.Key != indexTestKey(1) || keyHeld.Held != indexTestPage(1, 0).Tag ||
		keyHeld.Page != indexTestPage(2, 0).Tag {
		t.Fatalf("a key held: %v", err)
	}
	var pageHeld *PrefixPageHeldError
	err = x.Add(indexTestKey(2), indexTestPage(1, 0))
	if !errors.As(err, &pageHeld) || pageHeld.Page != indexTestPage(1, 0).Tag || pageHeld.Held != indexTestKey(1) ||
		pageHeld.Key != indexTestKey(2) {
		t.Fatalf("a page held: %v", err)
	}
	if got := indexes(x.Match([]PrefixKey{indexTestKey(1), indexTestKey(2)})); x.Len() != 1 || !slices.Equal(got, []uint32{1}) {
		t.Fatalf("after refusals: %d held, match %v", x.Len(), got)
	}
	mustAdd(t, x, 2, 1)
	var full *PrefixIndexFullError
	if err := x.Add(indexTestKey(3), indexTestPage(3, 2)); !errors.As(err, &full) || full.Pages != 2 || full.PagesMax != 2 {
		t.Fatalf("a full index: %v", err)
	}
}

func TestPrefixIndexBounds(t *testing.T) {
	if _, err := NewPrefixIndex(-1); err == nil {
		t.Fatal("an index of -1 pages was made")
	}
	x := newTestIndex(t, 0)
	var full *PrefixIndexFullError
	if err := x.Add(indexTestKey(1), indexTestPage(1, 0)); !errors.As(err, &full) {
		t.Fatalf("an index of 0 pages took one: %v", err)
	}
	if x.Len() != 0 || x.Room() != 0 || x.PagesMax() != 0 || x.Match([]PrefixKey{indexTestKey(1)}) != nil || x.Victims(1) != nil {
		t.Fatal("an index of 0 pages holds something")
	}
}

func TestPrefixIndexRemove(t *testing.T) {
	x := newTestIndex(t, 4)
	for id := range uint32(4) {
		mustAdd(t, x, id, int(id))
	}
	if !x.Remove(indexTestPage(2, 2).Tag) || x.Remove(indexTestPage(2, 2).Tag) {
		t.Fatal("Remove of a page held, then of the same page, did not say true then false")
	}
	if x.Has(indexTestKey(2)) || x.Room() != 1 {
		t.Fatalf("after Remove: key held %t, room %d", x.Has(indexTestKey(2)), x.Room())
	}
	if got := indexes(x.Pages()); !slices.Equal(got, []uint32{3, 1, 0}) {
		t.Fatalf("after Remove: %v, want the others deepest first", got)
	}
	mustAdd(t, x, 2, 2) // its key and tag are free again
}

// indexModel is a naive PrefixIndex: a list of entries sorted on demand.
type indexModel struct {
	max     int
	entries []modelEntry
	uses    uint64
	adds    uint64
}

type modelEntry struct {
	key         PrefixKey
	page        CachedPage
	used, added uint64
}

func (m *indexModel) lru() []modelEntry {
	es := slices.Clone(m.entries)
	sort.Slice(es, func(i, j int) bool {
		a, b := es[i], es[j]
		if a.used != b.used {
			return a.used < b.used
		}
		if a.page.First != b.page.First {
			return a.page.First > b.page.First
		}
		return a.added < b.added
	})
	return es
}

func (m *indexModel) find(pred func(e modelEntry) bool) int {
	return slices.IndexFunc(m.entries, pred)
}

// TestPrefixIndexAgainstModel drives the index and a naive model with the
// same random operations over a few keys and pages, and compares them.
func TestPrefixIndexAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		limit := rapid.IntRange(0, 5).Draw(t, "pagesMax")
		x, err := NewPrefixIndex(limit)
		if err != nil {
			t.Fatal(err)
		}
		m := &indexModel{max: limit}
		key := func(t *rapid.T) PrefixKey { return indexTestKey(uint32(rapid.IntRange(0, 7).Draw(t, "key"))) }
		t.Repeat(map[string]func(*rapid.T){
			"add": func(t *rapid.T) {
				k := key(t)
				c := indexTestPage(uint32(rapid.IntRange(0, 7).Draw(t, "page")), rapid.IntRange(0, 3).Draw(t, "depth"))
				err := x.Add(k, c)
				switch {
				case m.find(func(e modelEntry) bool { return e.key == k }) >= 0:
					agree(t, "add", &PrefixKeyHeldError{}, err)
				case m.find(func(e modelEntry) bool { return e.page.Tag == c.Tag }) >= 0:
					agree(t, "add", &PrefixPageHeldError{}, err)
				case len(m.entries) == m.max:
					agree(t, "add", &PrefixIndexFullError{}, err)
				default:
					agree(t, "add", nil, err)
					m.adds++
					m.entries = append(m.entries, modelEntry{key: k, page: c, used: m.uses, added: m.adds})
				}
			},
			"match": func(t *rapid.T) {
				keys := rapid.SliceOfN(rapid.Custom(key), 0, 4).Draw(t, "keys")
				got := x.Match(keys)
				m.uses++
				var want []CachedPage
				for _, k := range keys {
					i := m.find(func(e modelEntry) bool { return e.key == k })
					if i < 0 {
						break
					}
					m.entries[i].used = m.uses
					want = append(want, m.entries[i].page)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("match %v: %v, model %v", keys, got, want)
				}
			},
			"victims": func(t *rapid.T) {
				n := rapid.IntRange(-1, 6).Draw(t, "n")
				got := x.Victims(n)
				var want []CachedPage
				for _, e := range m.lru()[:max(0, min(n, len(m.entries)))] {
					want = append(want, e.page)
					m.entries = slices.DeleteFunc(m.entries, func(f modelEntry) bool { return f.key == e.key })
				}
				if !slices.Equal(got, want) {
					t.Fatalf("victims(%d): %v, model %v", n, got, want)
				}
			},
			"remove": func(t *rapid.T) {
				tag := indexTestPage(uint32(rapid.IntRange(0, 7).Draw(t, "page")), 0).Tag
				i := m.find(func(e modelEntry) bool { return e.page.Tag == tag })
				if got := x.Remove(tag); got != (i >= 0) {
					t.Fatalf("remove %s: %t, model holds it: %t", tag, got, i >= 0)
				}
				if i >= 0 {
					m.entries = slices.Delete(m.entries, i, i+1)
				}
			},
			"": func(t *rapid.T) {
				var want []CachedPage
				for _, e := range m.lru() {
					want = append(want, e.page)
				}
				if got := x.Pages(); !slices.Equal(got, want) {
					t.Fatalf("pages %v, model %v", got, want)
				}
				if x.Len() != len(m.entries) || x.Room() != m.max-len(m.entries) || x.PagesMax() != m.max || x.Len() > m.max {
					t.Fatalf("len %d room %d max %d, model holds %d of %d", x.Len(), x.Room(), x.PagesMax(), len(m.entries), m.max)
				}
				for _, e := range m.entries {
					if !x.Has(e.key) {
						t.Fatalf("the index lost key %s", e.key)
					}
				}
			},
		})
	})
}

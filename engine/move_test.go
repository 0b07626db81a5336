package engine

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/kvwarden/kvwarden/kv"
)

// grantAndStep steps s until out holds n tokens, granting a fresh page of
// p whenever s asks for one.
func grantAndStep(t *testing.T, s Sequence, p *kv.Pool, o kv.Owner, out []int, n int) []int {
	t.Helper()
	for len(out) < n {
		if at, need := s.NeedsPage(); need {
			if err := s.GrantPage(reserve(t, p, o, at, 1)[0]); err != nil {
				t.Fatal(err)
			}
		}
		tok, err := s.Step(p)
		if err != nil {
			t.Fatalf("step at %d tokens: %v", s.Tokens(), err)
		}
		out = append(out, tok)
	}
	return out
}

// running is a sequence of prompt in p that has streamed k tokens, the
// first prefill's, holding tail rows in its tail: what a decode node moves.
func running(t *testing.T, e *ReferenceEngine, p *kv.Pool, prompt []int, k, tail int) (Sequence, []int) {
	t.Helper()
	pf := prefill(t, e, p, ownerA, prompt)
	s, err := e.Decode(p, pf.Manifest, pf.First)
	if err != nil {
		t.Fatal(err)
	}
	out := grantAndStep(t, s, p, ownerA, []int{pf.First}, k)
	if held := len(s.Tail()) / p.Config().Geometry.BytesPerToken(); held != tail || s.Tokens() != s.Manifest().Tokens+held {
		t.Fatalf("after %d tokens the tail holds %d rows, want %d; %d positions, %d in pages", k, held, tail,
			s.Tokens(), s.Manifest().Tokens)
	}
	return s, out
}

// page is one page of a moving sequence: where its rows come from (a
// sealed page, or, for the tail, the page the source holds reserved for
// those positions), its seal checksum, and its rows.
type page struct {
	source kv.Tag
	sum    uint64
	rows   []byte
}

// pagesOf are the pages of s in p for a move: its manifest's, read under
// leases of their own, then its tail, summed as the page reserved for it
// (unwritten: the source writes nothing to move) would be sealed with it.
func pagesOf(t *testing.T, s Sequence, p *kv.Pool) []page {
	t.Helper()
	var out []page
	m := s.Manifest()
	for _, mp := range m.Pages {
		l, err := p.Lease(mp.Tag, ownerA)
		if err != nil {
			t.Fatal(err)
		}
		b, _, err := p.Read(l)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, page{source: mp.Tag, sum: mp.Checksum, rows: slices.Clone(b)})
		if err := p.Unlease(l); err != nil {
			t.Fatal(err)
		}
	}
	if tail := s.Tail(); len(tail) > 0 {
		g := p.Config().Geometry
		spare := reserve(t, p, ownerA, m.Tokens, 1)[0]
		out = append(out, page{source: spare, sum: kv.PageChecksum(spare, ownerA, m.Tokens, len(tail)/g.BytesPerToken(), tail),
			rows: tail})
	}
	return out
}

// TestMoveAcrossPools: the pages of a sequence that streamed k tokens, and
// its tail, move frame by frame, each sealed against its source's checksum,
// into another pool's pages at the same positions. There a new
// sequence of the same manifest recomputes the last row from the rows
// before it and the token fed there, finds the token the source streamed
// last, and goes on: the whole answer is the reference's, bit for bit,
// whether the tail was empty, one row, or a whole page. The source, had
// the move failed, goes on as if nothing had happened.
func TestMoveAcrossPools(t *testing.T) {
	e := engineFor(t, DefaultModelConfig())
	g := e.Config().Geometry(16)
	prompt := testPrompt(77, "move") // 4 full pages and 13 rows
	const n = 60
	want := reference(t, e, prompt, n)
	// The tail is empty before the first step, and a full one is written
	// out only at the step after.
	for _, tc := range []struct{ k, tail int }{{1, 0}, {2, 1}, {16, 15}, {17, 16}, {18, 1}, {40, 7}} {
		k := tc.k
		t.Run(fmt.Sprintf("after=%d", k), func(t *testing.T) {
			src := fragmentedPool(t, g, 64, 0x1111, uint64(k))
			s, out := running(t, e, src, prompt, k, tc.tail)
			dst := fragmentedPool(t, g, 64, 0x2222, uint64(k)+1)
			moved := &kv.Manifest{Owner: ownerB}
			// into fills a page of dst at the moved positions with rows sent
			// from source, and seals it only if they are the rows summed.
			into := func(source kv.Tag, sum uint64, rows []byte) (kv.Tag, uint64, error) {
				tag := reserve(t, dst, ownerB, moved.Tokens, 1)[0]
				wire, _, err := kv.AppendFrame(nil, &kv.Frame{Owner: ownerB, Source: source, Dest: tag, FirstToken: moved.Tokens,
					Tokens: len(rows) / g.BytesPerToken(), Payload: rows}, g.Limits())
				if err != nil {
					t.Fatal(err)
				}
				f, _, err := kv.DecodeFrame(wire, g.Limits())
				if err != nil {
					t.Fatal(err)
				}
				if err := dst.Accept(&f); err != nil {
					t.Fatal(err)
				}
				sum, err = dst.SealFrom(tag, ownerB, kv.Origin{Tag: source, Owner: ownerA, Checksum: sum})
				return tag, sum, err
			}
			for _, pg := range pagesOf(t, s, src) {
				rows := len(pg.rows) / g.BytesPerToken()
				bad := slices.Clone(pg.rows)
				bad[len(bad)-1] ^= 1
				var mismatch *kv.ChecksumMismatchError
				if _, _, err := into(pg.source, pg.sum, bad); !errors.As(err, &mismatch) {
					t.Fatalf("a page of %d rows, its last byte flipped on the way, sealed: %v", rows, err)
				}
				tag, sum, err := into(pg.source, pg.sum, pg.rows)
				if err != nil {
					t.Fatal(err)
				}
				moved.Pages = append(moved.Pages, kv.ManifestPage{Tag: tag, Tokens: rows, Checksum: sum})
				moved.Tokens += rows
			}
			if moved.Tokens != s.Tokens() {
				t.Fatalf("moved %d positions of the sequence's %d", moved.Tokens, s.Tokens())
			}

			// The move verified where the source is: the last row and the
			// last token streamed recomputed there.
			seq := slices.Concat(prompt, out)
			d, err := e.Decode(dst, moved, out[k-1])
			if err != nil {
				t.Fatal(err)
			}
			if tok, err := d.First(dst, seq[moved.Tokens-1]); err != nil || tok != out[k-1] {
				t.Fatalf("the move's last token recomputed: %d, %v; the source streamed %d", tok, err, out[k-1])
			}
			if tok, err := d.First(dst, seq[moved.Tokens-1]^1); err == nil {
				t.Fatalf("another token fed at the last position gave %d and no error", tok)
			}
			got := grantAndStep(t, d, dst, ownerB, slices.Clone(out), n)
			if !slices.Equal(got, want) {
				t.Fatalf("moved after %d tokens, the answer differs from the reference:\n got %v\nwant %v", k, got, want)
			}
			// The source, had the move failed, goes on as it was.
			if rest := grantAndStep(t, s, src, ownerA, out, n); !slices.Equal(rest, want) {
				t.Fatalf("the source, after its pages were read at %d tokens, differs from the reference:\n got %v\nwant %v",
					k, rest, want)
			}
			for _, x := range []struct {
				seq  Sequence
				pool *kv.Pool
				o    kv.Owner
			}{{d, dst, ownerB}, {s, src, ownerA}} {
				if err := x.seq.Manifest().Verify(x.pool); err != nil {
					t.Fatalf("manifest after the move: %v", err)
				}
				if err := x.seq.Close(x.pool); err != nil {
					t.Fatal(err)
				}
				releaseAll(t, x.pool, x.o)
			}
		})
	}
}

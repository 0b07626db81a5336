package kv

// Checks of the decoders and of a manifest's verification that other
// checks usually back up, each isolated: the input passes every other
// check (a frame's checksum is recomputed over what was changed, a
// manifest's entries add up), so only the check under test can refuse it.

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/zeebo/xxh3"
)

// resealed is encoded frame b with edit applied to its header and its
// checksum computed again, as a sender that means it would.
func resealed(b []byte, edit func(header []byte)) []byte {
	b = append([]byte(nil), b...)
	hdrEnd := frameFixedBytes + int(b[5])
	edit(b[:hdrEnd])
	h := append([]byte(nil), b[:hdrEnd]...)
	clear(h[frameChecksumAt : frameChecksumAt+8])
	binary.LittleEndian.PutUint64(b[frameChecksumAt:], xxh3.HashSeed(b[hdrEnd:], headerSeed(h)))
	return b
}

// TestDecodeFrameRefusesWhatItsChecksumCovers: a frame whose checksum is
// right is still refused for a request id of 0 (no request has it) or a
// reserved field that is not zero, with the field named.
func TestDecodeFrameRefusesWhatItsChecksumCovers(t *testing.T) {
	b := encode(t, testFrame(2))
	if _, _, err := DecodeFrame(resealed(b, func([]byte) {}), testLimits); err != nil {
		t.Fatalf("a frame resealed unchanged: %v", err)
	}
	for _, tc := range []struct {
		name string
		edit func(h []byte)
		want FrameError
	}{
		{"request id 0", func(h []byte) { clear(h[8:16]) }, FrameError{Field: "request id", Value: 0, Limit: 1}},
		{"reserved field set", func(h []byte) { h[6] = 1 }, FrameError{Field: "reserved", Value: 1, Limit: 0}},
	} {
		_, _, err := DecodeFrame(resealed(b, tc.edit), testLimits)
		var fe *FrameError
		if !errors.As(err, &fe) || *fe != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, &tc.want)
		}
	}
}

// TestDecodeBatchCountBound: a batch of PagesMax frames decodes; one whose
// header counts one more (its body holding them all) is refused for its
// count, naming it and the bound.
func TestDecodeBatchCountBound(t *testing.T) {
	lim := BatchLimits{PagesMax: 2, BytesMax: 3 * testLimits.FrameBytesMax(), Frame: testLimits}
	two, err := AppendBatch(nil, []Frame{testFrame(1), testFrame(2)}, lim)
	if err != nil {
		t.Fatal(err)
	}
	if got, _, err := DecodeBatch(two, lim); err != nil || len(got) != 2 {
		t.Fatalf("a batch of PagesMax frames: %d frames, %v", len(got), err)
	}
	wide := lim
	wide.PagesMax = 3
	three, err := AppendBatch(nil, []Frame{testFrame(1), testFrame(2), testFrame(3)}, wide)
	if err != nil {
		t.Fatal(err)
	}
	_, _, err = DecodeBatch(three, lim)
	var fe *FrameError
	if !errors.As(err, &fe) || *fe != (FrameError{Field: "batch frame count", Value: 3, Limit: 2}) {
		t.Fatalf("a batch of 3 frames, PagesMax 2: %v", err)
	}
}

// sealedManifest reserves, writes and seals alice's pages of tokens tokens
// in p and is their manifest, with the tags reserved.
func sealedManifest(t *testing.T, p *Pool, tokens int) (*Manifest, []Tag) {
	t.Helper()
	tags, err := p.Reserve(alice, 0, testGeom.PagesFor(tokens), t0)
	if err != nil {
		t.Fatal(err)
	}
	m, err := NewManifest(alice, tokens, testGeom.PageTokens, tags)
	if err != nil {
		t.Fatal(err)
	}
	for i, mp := range m.Pages {
		if err := p.Write(mp.Tag, alice, i*testGeom.PageTokens, rows(mp.Tokens, byte(i))); err != nil {
			t.Fatal(err)
		}
		if m.Pages[i].Checksum, err = p.Seal(mp.Tag, alice); err != nil {
			t.Fatal(err)
		}
	}
	return m, tags
}

// TestManifestVerifyEachCheck: each way a manifest can disagree with the
// pages, built so that only one check sees it, is refused with that
// check's numbers: the last page listed with a token more than it holds
// (the entries and the total agree, the seal's checksum is the page's),
// and an empty manifest.
func TestManifestVerifyEachCheck(t *testing.T) {
	p := newTestPool(t, 8)
	const tokens = 10 // pages of 4, 4, 2
	m, _ := sealedManifest(t, p, tokens)
	for _, tc := range []struct {
		name string
		mut  func(m *Manifest)
		want ManifestError
	}{
		{"the last page listed a token longer", func(m *Manifest) { m.Tokens, m.Pages[2].Tokens = 11, 3 },
			ManifestError{Field: "tokens", Page: 2, Want: 3, Have: 2}},
		{"no page and no token", func(m *Manifest) { m.Tokens, m.Pages = 0, nil },
			ManifestError{Field: "pages", Page: -1, Want: 0, Have: 0}},
		{"an empty page listed", func(m *Manifest) { m.Pages = append(m.Pages, ManifestPage{Tag: m.Pages[2].Tag}) },
			ManifestError{Field: "tokens", Page: 3, Want: 4, Have: 0}},
		{"more pages than tokens", func(m *Manifest) { m.Tokens, m.Pages[2].Tokens = 2, 0 },
			ManifestError{Field: "pages", Page: -1, Want: 1, Have: 3}},
	} {
		c := *m
		c.Pages = append([]ManifestPage(nil), m.Pages...)
		tc.mut(&c)
		var me *ManifestError
		if err := c.Verify(p); !errors.As(err, &me) || *me != tc.want {
			t.Errorf("%s: %v, want %v", tc.name, err, &tc.want)
		}
	}
	if err := m.Verify(p); err != nil {
		t.Fatalf("the manifest as sealed: %v", err)
	}
}

// TestManifestVerifyPartialPages: a manifest whose pages are not all full
// but the last (a sequence that sealed its tail to move holds a partial
// page there, as well as its prompt's last) verifies when every page holds
// the positions after the one before; a page reserved for other positions
// than those it is listed at is refused.
func TestManifestVerifyPartialPages(t *testing.T) {
	p := newTestPool(t, 8)
	m := &Manifest{Owner: alice, Tokens: 9}
	for i, run := range [][2]int{{0, 3}, {3, 4}, {7, 2}} { // first, tokens: 3 + 4 + 2 over pages of 4
		tags, err := p.Reserve(alice, run[0], 1, t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Write(tags[0], alice, run[0], rows(run[1], byte(i))); err != nil {
			t.Fatal(err)
		}
		sum, err := p.Seal(tags[0], alice)
		if err != nil {
			t.Fatal(err)
		}
		m.Pages = append(m.Pages, ManifestPage{Tag: tags[0], Tokens: run[1], Checksum: sum})
	}
	if err := m.Verify(p); err != nil {
		t.Fatalf("3 + 4 + 2 tokens: %v", err)
	}
	c := *m
	c.Pages = []ManifestPage{m.Pages[1], m.Pages[0], m.Pages[2]}
	var me *ManifestError
	if err := c.Verify(p); !errors.As(err, &me) || *me != (ManifestError{Field: "first position", Page: 0, Want: 0, Have: 3}) {
		t.Fatalf("pages listed out of order: %v", err)
	}
}

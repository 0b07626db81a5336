package kv

// Manifest is what a request expects to read: its owner, its token count,
// and, in sequence order, the tag of every page with the tokens it holds and
// the checksum it was sealed with. Page i holds the sequence positions that
// follow those of pages 0..i-1, from 0. Decode builds it from the tags it reserved,
// records each checksum as it seals, and verifies the whole manifest against
// the pool before it reads a byte.
type Manifest struct {
	Owner  Owner          `msgpack:"owner"`
	Tokens int            `msgpack:"tokens"`
	Pages  []ManifestPage `msgpack:"pages"`
}

// ManifestPage is one page of a manifest.
type ManifestPage struct {
	Tag      Tag    `msgpack:"tag"`
	Tokens   int    `msgpack:"tokens"`
	Checksum uint64 `msgpack:"sum"`
}

// NewManifest lays tokens tokens over tags in order, every page full but the
// last. It refuses a tag count that does not fit the token count.
func NewManifest(owner Owner, tokens, pageTokens int, tags []Tag) (*Manifest, error) {
	if tokens < 1 {
		return nil, &ManifestError{Field: "tokens", Page: -1, Want: 1, Have: tokens}
	}
	if want := (tokens + pageTokens - 1) / pageTokens; len(tags) != want {
		return nil, &ManifestError{Field: "pages", Page: -1, Want: want, Have: len(tags)}
	}
	m := &Manifest{Owner: owner, Tokens: tokens, Pages: make([]ManifestPage, len(tags))}
	for i, t := range tags {
		m.Pages[i] = ManifestPage{Tag: t, Tokens: min(pageTokens, tokens-i*pageTokens)}
	}
	return m, nil
}

// PageVerifier checks one manifest entry against the page it names (see
// Page.Verify): a Pool, or a client of page actors.
type PageVerifier interface {
	Geometry() Geometry
	VerifyPage(i, first int, mp ManifestPage, owner Owner) error
}

// Verify checks the manifest against the pages before decode reads: the
// pages add up to the token count, at least as many pages as full pages
// need and none empty (a sequence that moved between pools has a partial
// page where its tail was sealed, as well as its prompt's last), and every
// page's tag is current, belongs
// to the manifest's owner (tenant and request), holds the sequence
// positions that follow the previous page's, is sealed, holds exactly the
// tokens listed, was sealed with the listed checksum, and its bytes still
// hash to that checksum. Any difference is refused with the numbers.
func (m *Manifest) Verify(p PageVerifier) error {
	pt := p.Geometry().PageTokens
	if least := (m.Tokens + pt - 1) / pt; m.Tokens < 1 || len(m.Pages) < least || len(m.Pages) > m.Tokens {
		return &ManifestError{Field: "pages", Page: -1, Want: least, Have: len(m.Pages)}
	}
	total := 0
	for i, mp := range m.Pages {
		if mp.Tokens < 1 || mp.Tokens > pt {
			return &ManifestError{Field: "tokens", Page: i, Want: pt, Have: mp.Tokens}
		}
		if err := p.VerifyPage(i, total, mp, m.Owner); err != nil {
			return err
		}
		total += mp.Tokens
	}
	if total != m.Tokens {
		return &ManifestError{Field: "tokens", Page: -1, Want: m.Tokens, Have: total}
	}
	return nil
}

// VerifyPage implements PageVerifier (see Page.Verify).
func (p *Pool) VerifyPage(i, first int, mp ManifestPage, owner Owner) error {
	return p.do(mp.Tag, func(pg *Page) (bool, error) { return noFree(pg.Verify(i, first, mp, owner)) })
}

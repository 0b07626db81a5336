package engine

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
)

// KV is an engine's access to the pages of one pool, through the same
// checked calls as kv.Pool's: a *kv.Pool owned by the caller's goroutine, or
// a client whose every call is a message to a page actor.
type KV interface {
	kv.PageVerifier
	Write(tag kv.Tag, owner kv.Owner, first int, data []byte) error
	Seal(tag kv.Tag, owner kv.Owner) (uint64, error)
	Lease(tag kv.Tag, owner kv.Owner) (kv.Lease, error)
	Read(l kv.Lease) ([]byte, int, error)
	Unlease(l kv.Lease) error
}

// Engine computes a model over the paged KV of one pool. It touches KV only
// through the pool's checked calls: prefill writes a request's pages with
// the tags reserved for it and seals them; decode verifies a manifest,
// leases its pages and reads through the leases. An Engine holds no
// per-request state (that lives in a Sequence), so sequences of many
// requests may interleave on one engine. An engine's weights are
// immutable, and the reference engine may be used by many goroutines at
// once (every worker of a node shares one); a Sequence, like the pool it
// reads, is used by one goroutine at a time: the one that owns the pool.
type Engine interface {
	// Config is the model the engine computes.
	Config() ModelConfig
	// Prefill computes the KV of prompt and writes it to tags, in order,
	// as owner: tags must be exactly PagesFor(len(prompt)) pages reserved
	// by owner in pool from sequence position 0, and each is sealed. It returns the greedy first
	// generated token and the manifest of the pages, checksums filled in.
	// A refused write returns the pool's typed error; the pages already
	// sealed stay the caller's to release.
	Prefill(pool KV, owner kv.Owner, tags []kv.Tag, prompt []int) (Prefilled, error)
	// PrefillAfter is Prefill of a prompt whose first len(prefix) pages'
	// KV is already computed: prefix are read leases (shared leases on
	// cached pages, or any lease held) on pages that each hold the full
	// page of the prompt's KV at its place, in order, from position 0.
	// Only the prompt's tokens after them go through the model, attending
	// to the prefix pages' bytes; the prefix pages' bytes are copied to the
	// first len(prefix) of tags, so that the pages and manifest are those
	// Prefill would write. The prefix must leave at least one token to
	// compute (*CachedPrefixError): the first generated token needs the
	// logits of the prompt's last. Every prefix lease is read before the
	// pass and again for its copy: a page that does not hold a full page
	// is refused with a *kv.ManifestError, a lease the pool refuses with
	// the pool's typed error, and, as in Prefill, the pages already sealed
	// stay the caller's to release.
	PrefillAfter(pool KV, owner kv.Owner, tags []kv.Tag, prompt []int, prefix []kv.Lease) (Prefilled, error)
	// Decode starts generation over the pages of m, after verifying m
	// against pool and leasing every page. next is the token to feed first:
	// the First of the prefill that produced the KV.
	Decode(pool KV, m *kv.Manifest, next int) (Sequence, error)
}

// Prefilled is what Prefill returns.
type Prefilled struct {
	// First is the greedy next token after the prompt.
	First int
	// Manifest lists the prompt's pages in order with their token counts
	// and the checksums they were sealed with.
	Manifest *kv.Manifest
}

// Sequence is the decode state of one request: its pages in manifest order,
// the tail of generated tokens' KV not yet a full page, its position and the
// next token to feed. Sealed pages are immutable, so generated KV collects
// in the tail, and each time the tail is a full page the sequence writes it
// to a page the caller granted, seals and leases it. It reads KV only
// through its leases, re-presenting each lease at every step, so a page
// reclaimed under it fails the step instead of being read.
type Sequence interface {
	// Step feeds the next token and returns the greedy token after it. When
	// NeedsPage says so it first needs a page from GrantPage and otherwise
	// returns a *NeedPageError; on any error the sequence is unchanged
	// unless the error says the sequence is unusable.
	Step(pool KV) (int, error)
	// NeedsPage reports that the tail is a full page and no page is granted,
	// and the sequence position the page will hold from: the caller
	// reserves it with pool.Reserve(owner, first, 1) and grants it.
	NeedsPage() (first int, need bool)
	// GrantPage gives the sequence a page reserved for its owner from the
	// position NeedsPage names, to hold the tail once it is full. It holds
	// at most one; the page is written only when needed.
	GrantPage(tag kv.Tag) error
	// Tail is a copy of the KV rows the sequence holds past its manifest's
	// pages (those of the positions from Manifest().Tokens on, fewer than
	// a page): with the pages, every row a running sequence holds, for it
	// to move to another pool while it stays as it is here.
	Tail() []byte
	// Tokens is the number of positions whose KV the sequence holds.
	Tokens() int
	// Manifest lists the sealed pages, prompt pages first, then the pages
	// sealed during decode; its Tokens leaves out the tail.
	Manifest() *kv.Manifest
	// Close gives back every lease. It releases no page: the pages of
	// Manifest and a granted page not in it remain the caller's to release.
	Close(pool KV) error
	// First recomputes, before the first Step, the greedy token after the
	// positions the manifest holds, from their KV rows before the last and
	// the token fed at the last, last: a decode node's check of the first
	// token its prefill peer sent, or of the last token a moved sequence
	// streamed where it was (Tail). It also fails when the last KV row
	// is not the one the recomputation gives.
	First(pool KV, last int) (int, error)
}

// ContextFullError: a sequence would hold more positions than the model's
// context window.
type ContextFullError struct {
	Tokens, Limit int
}

func (e *ContextFullError) Error() string {
	return fmt.Sprintf("engine: %d tokens exceed the model's context window of %d tokens", e.Tokens, e.Limit)
}

// TokenError: a token id is outside the model's vocabulary.
type TokenError struct {
	Index, Token, Vocab int
}

func (e *TokenError) Error() string {
	return fmt.Sprintf("engine: token %d at index %d is outside the vocabulary [0, %d)", e.Token, e.Index, e.Vocab)
}

// GeometryError: the pool's page geometry is not the model's.
type GeometryError struct {
	Model, Pool kv.Geometry
}

func (e *GeometryError) Error() string {
	return fmt.Sprintf("engine: pool geometry (%s) does not fit the model (%s)", e.Pool, e.Model)
}

// NeedPageError: the sequence's tail is a full page and no page is granted.
type NeedPageError struct {
	Tokens, PageTokens int
}

func (e *NeedPageError) Error() string {
	return fmt.Sprintf("engine: sequence at %d tokens has a full tail of %d tokens and needs a granted page", e.Tokens, e.PageTokens)
}

// CachedPrefixError: a cached prefix of Pages full pages of PageTokens
// tokens leaves none of a prompt of Prompt tokens to compute.
type CachedPrefixError struct {
	Pages, PageTokens, Prompt int
}

func (e *CachedPrefixError) Error() string {
	return fmt.Sprintf("engine: a cached prefix of %d pages of %d tokens leaves none of the prompt's %d tokens to compute",
		e.Pages, e.PageTokens, e.Prompt)
}

// ErrEmptyPrompt: prefill of zero tokens.
var ErrEmptyPrompt = errors.New("engine: prompt has no tokens")

// ErrSequenceTwice: a sequence given to StepBatch twice in one call.
var ErrSequenceTwice = errors.New("engine: sequence given twice in one batch")

// ErrSequenceClosed: a call on a closed sequence.
var ErrSequenceClosed = errors.New("engine: sequence closed")

// ReferenceEngine is the built-in engine: a small transformer computed in
// float32 on the CPU with weights generated from the config's seed. It
// exists so that every path through the runtime computes real attention
// over paged KV, where a stale or foreign page changes the answer.
type ReferenceEngine struct {
	m *model
	// scratches are forward-pass activations for decode steps, shared by
	// the engine's sequences: a step takes one for the pass and puts it
	// back, so a sequence holds none between steps, and steps allocate
	// nothing once the pool holds one as large as the largest batch.
	scratches sync.Pool
}

var _ Engine = (*ReferenceEngine)(nil)

// NewReferenceEngine validates cfg and generates the weights from its
// seed.
func NewReferenceEngine(cfg ModelConfig) (*ReferenceEngine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return NewEngine(cfg, seededWeights(cfg))
}

// NewEngine is the reference engine over weights w of the model cfg, which
// it validates against each other (every array's length; every weight
// finite). The engine keeps w and shares it with every sequence: nothing
// may change it afterwards.
func NewEngine(cfg ModelConfig, w Weights) (*ReferenceEngine, error) {
	m, err := newModel(cfg, w)
	if err != nil {
		return nil, err
	}
	return &ReferenceEngine{m: m}, nil
}

// Config is the model the engine computes.
func (e *ReferenceEngine) Config() ModelConfig { return e.m.cfg }

func (e *ReferenceEngine) checkPool(pool KV) (kv.Geometry, error) {
	g := pool.Geometry()
	if want := e.m.cfg.Geometry(g.PageTokens); g != want {
		return g, &GeometryError{Model: want, Pool: g}
	}
	return g, nil
}

func (e *ReferenceEngine) checkTokens(tokens []int) error {
	for i, t := range tokens {
		if t < 0 || t >= e.m.cfg.Vocab {
			return &TokenError{Index: i, Token: t, Vocab: e.m.cfg.Vocab}
		}
	}
	return nil
}

// checkPrompt refuses what the model cannot compute, before any work.
func (e *ReferenceEngine) checkPrompt(prompt []int) error {
	if len(prompt) == 0 {
		return ErrEmptyPrompt
	}
	if len(prompt) > e.m.cfg.ContextTokens {
		return &ContextFullError{Tokens: len(prompt), Limit: e.m.cfg.ContextTokens}
	}
	return e.checkTokens(prompt)
}

// Prefill implements Engine: PrefillAfter with no cached prefix.
func (e *ReferenceEngine) Prefill(pool KV, owner kv.Owner, tags []kv.Tag, prompt []int) (Prefilled, error) {
	return e.PrefillAfter(pool, owner, tags, prompt, nil)
}

// PrefillAfter implements Engine. The prompt's tokens after the prefix go
// through the model at once, attending to the prefix pages' bytes where
// the pool holds them; their KV rows collect in a request-local buffer in
// page layout, and then every page goes to the pool with one Write: the
// prefix pages' bytes, then the computed rows.
func (e *ReferenceEngine) PrefillAfter(pool KV, owner kv.Owner, tags []kv.Tag, prompt []int, prefix []kv.Lease) (Prefilled, error) {
	g, err := e.checkPool(pool)
	if err != nil {
		return Prefilled{}, err
	}
	if err := e.checkPrompt(prompt); err != nil {
		return Prefilled{}, err
	}
	m, err := kv.NewManifest(owner, len(prompt), g.PageTokens, tags)
	if err != nil {
		return Prefilled{}, err
	}
	cached := len(prefix) * g.PageTokens
	if cached >= len(prompt) {
		return Prefilled{}, &CachedPrefixError{Pages: len(prefix), PageTokens: g.PageTokens, Prompt: len(prompt)}
	}
	past := make([][]byte, len(prefix))
	for i := range prefix {
		if past[i], err = readPrefix(pool, prefix, i, g.PageTokens); err != nil {
			return Prefilled{}, err
		}
	}
	bpt := g.BytesPerToken()
	rows := make([]byte, (len(prompt)-cached)*bpt)
	sc := newScratch(e.m.cfg, len(prompt)-cached, 1)
	fr := sc.prefillRows(e.m, prompt[cached:], cached, past, rows)
	e.m.forward(sc, fr)
	first := fr[len(fr)-1].next
	pos := 0
	for i := range m.Pages {
		mp := &m.Pages[i]
		var data []byte
		if i < len(prefix) {
			// Read again, not the bytes the pass read: the bytes of a Read
			// are not to be kept past a write to the pool (see StepBatch).
			if data, err = readPrefix(pool, prefix, i, g.PageTokens); err != nil {
				return Prefilled{}, err
			}
		} else {
			data = rows[(pos-cached)*bpt : (pos-cached+mp.Tokens)*bpt]
		}
		if err := pool.Write(mp.Tag, owner, pos, data); err != nil {
			return Prefilled{}, err
		}
		pos += mp.Tokens
		if mp.Checksum, err = pool.Seal(mp.Tag, owner); err != nil {
			return Prefilled{}, err
		}
	}
	return Prefilled{First: first, Manifest: m}, nil
}

// readPrefix reads page i of a cached prefix through its lease and checks
// that it holds a full page.
func readPrefix(pool KV, prefix []kv.Lease, i, pageTokens int) ([]byte, error) {
	b, n, err := pool.Read(prefix[i])
	if err != nil {
		return nil, err
	}
	if n != pageTokens {
		return nil, &kv.ManifestError{Field: "cached prefix tokens", Page: i, Want: pageTokens, Have: n}
	}
	return b, nil
}

// Decode implements Engine.
func (e *ReferenceEngine) Decode(pool KV, m *kv.Manifest, next int) (Sequence, error) {
	g, err := e.checkPool(pool)
	if err != nil {
		return nil, err
	}
	if err := e.checkTokens([]int{next}); err != nil {
		return nil, err
	}
	if err := m.Verify(pool); err != nil && !mutant.Is(mutant.NoManifestVerify) && !mutant.Is(mutant.Incident) {
		return nil, err
	}
	if m.Tokens >= e.m.cfg.ContextTokens {
		return nil, &ContextFullError{Tokens: m.Tokens + 1, Limit: e.m.cfg.ContextTokens}
	}
	pagesMax := len(m.Pages) + g.PagesFor(e.m.cfg.ContextTokens-m.Tokens)
	s := &refSequence{
		e: e, m: e.m, geo: g, owner: m.Owner,
		pages:  make([]kv.ManifestPage, 0, pagesMax),
		leases: make([]kv.Lease, 0, pagesMax),
		segs:   make([][]byte, 0, pagesMax+1),
		tail:   make([]byte, g.PageBytes()),
		pos:    m.Tokens, next: next,
	}
	for _, mp := range m.Pages {
		l, err := pool.Lease(mp.Tag, m.Owner)
		if err != nil {
			return nil, errors.Join(err, s.Close(pool))
		}
		s.pages = append(s.pages, mp)
		s.leases = append(s.leases, l)
	}
	return s, nil
}

// refSequence is the ReferenceEngine's Sequence. Everything a step needs is
// allocated when it starts, or borrowed from the engine for the step, so
// steps allocate nothing.
type refSequence struct {
	e       *ReferenceEngine
	m       *model
	geo     kv.Geometry
	owner   kv.Owner
	pages   []kv.ManifestPage // manifest order; pages[i] is read through leases[i]
	leases  []kv.Lease
	segs    [][]byte // per step: the pages' bytes, then the tail's
	tail    []byte   // one page of KV rows; the first tailN are held
	tailN   int
	spare   kv.Tag
	spareOK bool
	pos     int   // positions whose KV is held: pages + tail
	next    int   // the token the next step feeds
	broken  error // set when a page was written but not sealed or leased
	closed  bool
	batched bool // in the StepBatch running now
}

func (s *refSequence) Step(pool KV) (int, error) {
	if err := s.prepare(pool); err != nil {
		return 0, err
	}
	if err := s.readPages(pool); err != nil {
		return 0, err
	}
	sc := s.e.scratch(1)
	rows := sc.fwd[:1]
	rows[0] = s.row()
	s.m.forward(sc, rows)
	tok := s.commit(&rows[0])
	s.e.scratches.Put(sc)
	return tok, nil
}

// prepare makes the checks of a step that change nothing, and moves a full
// tail to its granted page: everything a step writes to the pool, before
// any page is read.
func (s *refSequence) prepare(pool KV) error {
	if err := s.usable(); err != nil {
		return err
	}
	if s.pos >= s.m.cfg.ContextTokens {
		return &ContextFullError{Tokens: s.pos + 1, Limit: s.m.cfg.ContextTokens}
	}
	if s.tailN == s.geo.PageTokens {
		return s.flush(pool)
	}
	return nil
}

// row is the forward row of the step after readPages: the next token at
// the next position, attending to the pages and the tail held, its KV row
// going to the tail.
func (s *refSequence) row() fwdRow {
	bpt := s.geo.BytesPerToken()
	s.segs = append(s.segs, s.tail[:s.tailN*bpt])
	return fwdRow{tok: s.next, pos: s.pos, past: s.segs, cur: s.tail[s.tailN*bpt : (s.tailN+1)*bpt], logits: true}
}

// commit takes the step whose row r the forward pass computed: its KV row
// is held in the tail, and its token is the one to feed next.
func (s *refSequence) commit(r *fwdRow) int {
	s.segs = s.segs[:0] // the bytes of a Read are not to be kept past the step
	s.tailN++
	s.pos++
	s.next = r.next
	return r.next
}

// StepBatch steps each sequence of seqs as its Step would, and sets toks[i]
// and errs[i] to what seqs[i].Step(pool) would have returned; toks and errs
// are at least as long as seqs.
//
// The reference engine's sequences step together, one forward pass per
// engine: each weight matrix is read once for all of them, and each
// sequence gets exactly the bits its own Step would compute. Each is
// checked as Step checks it (closed or unusable, the context full, a full
// tail without a granted page, every page read again under its lease), and
// a sequence that fails fails alone, as its Step would have failed, while
// the others step. Every sequence's checks and page writes come before any
// page is read, since a write to the pool may move the bytes an earlier
// Read returned. Sequences of other engines step one by one, each place
// by its own Step; a reference sequence given twice steps once: its second
// place gets ErrSequenceTwice.
func StepBatch(pool KV, seqs []Sequence, toks []int, errs []error) {
	toks, errs = toks[:len(seqs)], errs[:len(seqs)]
	// Cleared however the step ends, a panic in a pool's call included, so
	// that a sequence is never left marked as in a batch.
	defer func() {
		for _, s := range seqs {
			if rs, ok := s.(*refSequence); ok {
				rs.batched = false
			}
		}
	}()
	for i, s := range seqs {
		toks[i], errs[i] = 0, nil
		switch rs, ok := s.(*refSequence); {
		case !ok:
			toks[i], errs[i] = s.Step(pool)
		case rs.batched:
			errs[i] = ErrSequenceTwice
		default:
			rs.batched = true
			errs[i] = rs.prepare(pool)
		}
	}
	// in is the sequence at i if it is still to step in this batch.
	in := func(i int) *refSequence {
		if rs, ok := seqs[i].(*refSequence); ok && errs[i] == nil && rs.batched {
			return rs
		}
		return nil
	}
	for i := range seqs {
		if rs := in(i); rs != nil {
			errs[i] = rs.readPages(pool)
		}
	}
	for {
		var e *ReferenceEngine
		n := 0
		for i := range seqs {
			if rs := in(i); rs != nil && (e == nil || rs.e == e) {
				e = rs.e
				n++
			}
		}
		if e == nil {
			break
		}
		sc := e.scratch(n)
		rows := sc.fwd[:0]
		for i := range seqs {
			if rs := in(i); rs != nil && rs.e == e {
				rows = append(rows, rs.row())
			}
		}
		e.m.forward(sc, rows)
		j := 0
		for i := range seqs {
			if rs := in(i); rs != nil && rs.e == e {
				toks[i] = rs.commit(&rows[j])
				rs.batched = false
				j++
			}
		}
		e.scratches.Put(sc)
	}
}

// scratch is a forward pass's activations for up to rows rows, from the
// pool when it holds one large enough; the caller puts it back.
func (e *ReferenceEngine) scratch(rows int) *scratch {
	if sc, _ := e.scratches.Get().(*scratch); sc != nil && sc.rows >= rows {
		return sc
	}
	return newScratch(e.m.cfg, rows, rows)
}

// readPages reads every page again under its lease into s.segs, checking
// that each holds the tokens its manifest says.
func (s *refSequence) readPages(pool KV) error {
	s.segs = s.segs[:0]
	for i, l := range s.leases {
		b, n, err := pool.Read(l)
		if err != nil {
			return err
		}
		if n != s.pages[i].Tokens {
			if !mutant.Is(mutant.Incident) {
				return &kv.ManifestError{Field: "tokens", Page: i, Want: s.pages[i].Tokens, Have: n}
			}
			b = b[:s.pages[i].Tokens*s.geo.BytesPerToken()] // the planted bug: rows never written are read as they are
		}
		s.segs = append(s.segs, b)
	}
	return nil
}

func (s *refSequence) First(pool KV, last int) (int, error) {
	if err := s.usable(); err != nil {
		return 0, err
	}
	if len(s.pages) == 0 || s.tailN != 0 || s.pos != s.promptTokens() {
		return 0, errors.New("engine: the first token is recomputed only before the first step")
	}
	if last < 0 || last >= s.m.cfg.Vocab {
		return 0, &TokenError{Index: 0, Token: last, Vocab: s.m.cfg.Vocab}
	}
	if err := s.readPages(pool); err != nil {
		return 0, err
	}
	bpt := s.geo.BytesPerToken()
	lastPage := s.segs[len(s.segs)-1]
	held := lastPage[len(lastPage)-bpt:]
	s.segs[len(s.segs)-1] = lastPage[:len(lastPage)-bpt]
	sc := s.e.scratch(1)
	rows := sc.fwd[:1]
	// The tail is empty before the first step: the row goes to its start.
	rows[0] = fwdRow{tok: last, pos: s.pos - 1, past: s.segs, cur: s.tail[:bpt], logits: true}
	s.m.forward(sc, rows)
	tok := rows[0].next
	s.e.scratches.Put(sc)
	s.segs = s.segs[:0]
	if !bytes.Equal(s.tail[:bpt], held) {
		return 0, fmt.Errorf("engine: the last KV row held (position %d) is not the one its token gives", s.pos-1)
	}
	return tok, nil
}

// promptTokens is how many positions the prompt's pages hold.
func (s *refSequence) promptTokens() int {
	n := 0
	for _, p := range s.pages {
		n += p.Tokens
	}
	return n
}

func (s *refSequence) usable() error {
	if s.closed {
		return ErrSequenceClosed
	}
	return s.broken
}

// flush moves the full tail to the granted page. A refused write leaves the
// sequence as it was, without the page; a refusal after the write leaves the
// page half-done, and the sequence unusable.
func (s *refSequence) flush(pool KV) error {
	if !s.spareOK {
		return &NeedPageError{Tokens: s.pos, PageTokens: s.geo.PageTokens}
	}
	tag := s.spare
	s.spareOK = false
	if err := pool.Write(tag, s.owner, s.pos-s.tailN, s.tail); err != nil {
		return err
	}
	sum, err := pool.Seal(tag, s.owner)
	if err == nil {
		var l kv.Lease
		if l, err = pool.Lease(tag, s.owner); err == nil {
			s.pages = append(s.pages, kv.ManifestPage{Tag: tag, Tokens: s.tailN, Checksum: sum})
			s.leases = append(s.leases, l)
			s.tailN = 0
			return nil
		}
	}
	s.broken = fmt.Errorf("engine: sequence unusable: page %s written but not sealed and leased: %w", tag, err)
	return s.broken
}

func (s *refSequence) Tail() []byte { return bytes.Clone(s.tail[:s.tailN*s.geo.BytesPerToken()]) }

func (s *refSequence) NeedsPage() (int, bool) {
	return s.pos - s.tailN, s.tailN == s.geo.PageTokens && !s.spareOK
}

func (s *refSequence) GrantPage(tag kv.Tag) error {
	if err := s.usable(); err != nil {
		return err
	}
	if s.spareOK {
		return fmt.Errorf("engine: sequence already holds granted page %s; refused %s", s.spare, tag)
	}
	s.spare, s.spareOK = tag, true
	return nil
}

func (s *refSequence) Tokens() int { return s.pos }

func (s *refSequence) Manifest() *kv.Manifest {
	return &kv.Manifest{Owner: s.owner, Tokens: s.pos - s.tailN, Pages: slices.Clone(s.pages)}
}

func (s *refSequence) Close(pool KV) error {
	if s.closed {
		return ErrSequenceClosed
	}
	s.closed = true
	var errs []error
	for _, l := range s.leases {
		if err := pool.Unlease(l); err != nil {
			errs = append(errs, err)
		}
	}
	s.leases = nil
	return errors.Join(errs...)
}

// Reference generates maxNew greedy tokens after prompt, keeping the KV in
// one contiguous buffer: no pool, no pages, no tags. It is the single-node
// oracle every other path must equal bit for bit.
func (e *ReferenceEngine) Reference(prompt []int, maxNew int) ([]int, error) {
	if err := e.checkPrompt(prompt); err != nil {
		return nil, err
	}
	if maxNew < 1 {
		return nil, fmt.Errorf("engine: reference of %d new tokens: want at least 1", maxNew)
	}
	// The last generated token is returned, never fed, so its KV is not kept.
	held := len(prompt) + maxNew - 1
	if held > e.m.cfg.ContextTokens {
		return nil, &ContextFullError{Tokens: held, Limit: e.m.cfg.ContextTokens}
	}
	bpt := e.m.geo.BytesPerToken()
	cache := make([]byte, held*bpt)
	out := make([]int, 0, maxNew)
	sc := newScratch(e.m.cfg, len(prompt), 1)
	rows := sc.prefillRows(e.m, prompt, 0, nil, cache[:len(prompt)*bpt])
	e.m.forward(sc, rows)
	out = append(out, rows[len(rows)-1].next)
	past := make([][]byte, 1)
	for pos := len(prompt); len(out) < maxNew; pos++ {
		past[0] = cache[:pos*bpt]
		row := sc.prefillRows(e.m, out[len(out)-1:], pos, past, cache[pos*bpt:(pos+1)*bpt])
		e.m.forward(sc, row)
		out = append(out, row[0].next)
	}
	return out, nil
}

// Logits computes the sequence tokens in one pass, as a prompt, and
// returns the logits of every position: row i (Vocab values) scores the
// token that follows tokens[0..i]. Its argmax is the token Reference
// would pick there, bit for bit. It is for comparing the model with
// another implementation token by token (teacher forcing).
func (e *ReferenceEngine) Logits(tokens []int) ([]float32, error) {
	if err := e.checkPrompt(tokens); err != nil {
		return nil, err
	}
	bpt := e.m.geo.BytesPerToken()
	sc := newScratch(e.m.cfg, len(tokens), len(tokens))
	rows := sc.prefillRows(e.m, tokens, 0, nil, make([]byte, len(tokens)*bpt))
	for i := range rows {
		rows[i].logits = true
	}
	e.m.forward(sc, rows)
	return sc.logits, nil
}

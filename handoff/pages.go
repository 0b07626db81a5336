package handoff

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/internal/mutant"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// Pages is one pool as the effects use it: the engine's checked calls and
// the page lifecycle's. A *kv.Pool with a clock, or a client of page
// actors.
type Pages interface {
	engine.KV
	// Reserve takes n pages for owner from sequence position first, all
	// or nothing.
	Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error)
	// WriteOwned is Write for data that nothing else will change (a
	// received frame's payload): it may be kept without a copy.
	WriteOwned(tag kv.Tag, owner kv.Owner, first int, data []byte) error
	SealFrom(tag kv.Tag, owner kv.Owner, o kv.Origin) (uint64, error)
	AwaitAck(tag kv.Tag, owner kv.Owner) error
	Ack(tag kv.Tag, owner kv.Owner) error
	Release(tag kv.Tag, owner kv.Owner) error
}

// ExecReserve carries out a Reserve: the prompt's pages (or the layout's),
// then the spare ones, all or nothing.
func ExecReserve(p Pages, e Reserve) Reserved {
	dest, err := reserveDest(p, e)
	if err != nil || e.Spare == 0 {
		return Reserved{Dest: dest, Err: err}
	}
	spare, err := p.Reserve(e.Owner, e.SpareFirst, e.Spare)
	if err != nil {
		ExecRelease(p, Release{Owner: e.Owner, Tags: dest}, nil)
		return Reserved{Err: err}
	}
	return Reserved{Dest: dest, Spare: spare}
}

// reserveDest reserves a Reserve's first pages: Prompt full pages from
// position 0, or one for each entry of Layout at its positions, a run of
// full pages in one call.
func reserveDest(p Pages, e Reserve) ([]kv.Tag, error) {
	if e.Layout == nil {
		return p.Reserve(e.Owner, 0, e.Prompt)
	}
	pt := p.Geometry().PageTokens
	var dest []kv.Tag
	for i, first := 0, 0; i < len(e.Layout); {
		n, run := 1, e.Layout[i] // pages in the run, and their positions
		for i+n < len(e.Layout) && e.Layout[i+n-1] == pt {
			run += e.Layout[i+n]
			n++
		}
		tags, err := p.Reserve(e.Owner, first, n)
		if err != nil {
			ExecRelease(p, Release{Owner: e.Owner, Tags: dest}, nil)
			return nil, err
		}
		dest = append(dest, tags...)
		i, first = i+n, first+run
	}
	return dest, nil
}

// ExecWrite carries out a Write as owner, stopping at the first refusal.
func ExecWrite(p Pages, e Write) Written {
	for i, f := range e.Frames {
		if err := p.WriteOwned(f.Dest, f.Owner, f.FirstToken, f.Payload); err != nil {
			return Written{N: i, Err: err}
		}
	}
	return Written{N: len(e.Frames)}
}

// ExecSealVerify carries out a SealVerify as the manifest's owner.
func ExecSealVerify(p Pages, e SealVerify) Verified {
	m := e.Manifest
	for i := range m.Pages {
		if mutant.Is(mutant.Incident) && e.Origins[i].Tag == (kv.Tag{}) {
			continue // the planted bug: a page nothing was sent for is taken as it is
		}
		var sum uint64
		var err error
		if mutant.Is(mutant.HeldCopyUnchecked) && e.Origins[i].Owner.Request == 0 {
			sum, err = p.Seal(m.Pages[i].Tag, m.Owner) // the planted bug: a held copy (its origin a cached page) is sealed as it is
		} else {
			sum, err = p.SealFrom(m.Pages[i].Tag, m.Owner, e.Origins[i])
		}
		if err != nil {
			return Verified{Err: err}
		}
		m.Pages[i].Checksum = sum
	}
	if mutant.Is(mutant.NoManifestVerify) || mutant.Is(mutant.Incident) {
		return Verified{} // the planted bug: decode reads what the manifest names, unverified
	}
	return Verified{Err: m.Verify(p)}
}

// ExecRelease gives every page of e back; refused, if not nil, hears of
// each page that refused. A page of another owner is a broken invariant:
// see OwnsOrPanic.
func ExecRelease(p Pages, e Release, refused func(kv.Tag, error)) {
	each("release", p.Release, e.Owner, e.Tags, refused)
}

// ExecAck acknowledges every page of e; refused as for ExecRelease.
func ExecAck(p Pages, e Ack, refused func(kv.Tag, error)) {
	each("ack", p.Ack, e.Owner, e.Tags, refused)
}

func each(name string, op func(kv.Tag, kv.Owner) error, o kv.Owner, tags []kv.Tag, refused func(kv.Tag, error)) {
	for _, t := range tags {
		if err := op(t, o); err != nil {
			OwnsOrPanic(err, name, t, o)
			if refused != nil {
				refused(t, err)
			}
		}
	}
}

// OwnsOrPanic is the check on a refused release or ack of a page the
// caller reserved itself: a stale tag (the page was reclaimed) is expected,
// but a page that belongs to another owner means two owners, a broken
// invariant that must stop the node rather than be logged.
func OwnsOrPanic(err error, op string, t kv.Tag, o kv.Owner) {
	var tenant *kv.WrongTenantError
	var owner *kv.WrongOwnerError
	if errors.As(err, &tenant) || errors.As(err, &owner) {
		panic(fmt.Sprintf("handoff: %s of page %s by %s, who reserved it, and it belongs to another owner: %v", op, t, o, err))
	}
}

// Frames is a prefilled plan in hand: the frames to send and the leases
// that keep their payloads (the pages' bytes) unchanged until they went.
type Frames struct {
	Frames []kv.Frame
	Leases []kv.Lease
}

// Unlease gives the leases back and reports what refused.
func (f *Frames) Unlease(p Pages) error {
	var err error
	for _, l := range f.Leases {
		err = errors.Join(err, p.Unlease(l))
	}
	f.Leases = nil
	return err
}

// ExecPrefill carries out a Prefill with engine over p: it reserves the
// source pages, computes the prompt's KV into them, leases every page and
// reads it into a frame addressed to the plan's destination tag, and marks
// it as awaiting decode's ack. On failure no lease is left and no frame
// returned; the source pages reserved are named in the Prefilled, for the
// Source to release.
func ExecPrefill(engine engine.Engine, p Pages, e Prefill) (Prefilled, Frames) {
	return execPrefill(engine, p, nil, e)
}

// ExecPrefillCached is ExecPrefill over a pool with a prefix cache: the
// longest run of the prompt's full pages cached in the plan's scope is
// leased and read, not computed (attention reads the cached pages, and
// their bytes are copied into the request's own source pages, so the
// transfer is the same as without a cache), and the pages it computes are
// named for the cache to keep once decode has them (Prefilled.Chain). When
// the pool is exhausted, cached pages are given up to make room.
func ExecPrefillCached(engine engine.Engine, p CachePages, c *PrefixCache, e Prefill) (Prefilled, Frames) {
	return execPrefill(engine, p, c, e)
}

func execPrefill(engine engine.Engine, p Pages, c *PrefixCache, e Prefill) (Prefilled, Frames) {
	out, fr := prefill(engine, p, c, e)
	if out.Err != nil {
		out.Err = errors.Join(out.Err, fr.Unlease(p))
		out.Chain, out.Cached = nil, 0
		fr = Frames{}
	}
	return out, fr
}

func prefill(engine engine.Engine, p Pages, c *PrefixCache, e Prefill) (out Prefilled, fr Frames) {
	out.Key = e.Key
	prompt := ints(e.Plan.PromptTokens)
	var (
		prefix []kv.Lease
		read   []kv.CachedPage // the pages of prefix
		keys   []kv.PrefixKey
		cp     CachePages
		err    error
	)
	reserve := func(n int) ([]kv.Tag, error) { return p.Reserve(e.Local, 0, n) }
	if c != nil {
		cp = p.(CachePages)
		out.Scope = c.scopeOf(e.Plan.Tenant, e.Plan.CacheSalt)
		if prefix, read, keys, err = c.lookup(cp, out.Scope, e.Local, prompt); err != nil {
			out.Err = err
			return out, fr
		}
		// The cached bytes are copied into the source pages before the
		// leases go back (out is the result: a refusal is reported).
		defer func() {
			for _, l := range prefix {
				out.Err = errors.Join(out.Err, p.Unlease(l))
			}
		}()
		use := c.index.Uses() // the lookup's: what this prefill reads is not given up
		reserve = func(n int) ([]kv.Tag, error) { return c.reserveEvicting(cp, e.Local, n, use) }
		out.Chain = keys
	}
	tags, err := reserve(p.Geometry().PagesFor(len(prompt)))
	if err != nil && mutant.Is(mutant.Incident) {
		// The planted bug: a prompt the pool cannot hold is replaced by a
		// one-token placeholder, sent as if it were the prompt.
		prompt = prompt[:1]
		tags, err = p.Reserve(e.Local, 0, 1)
	}
	if err != nil {
		out.Err = err
		return out, fr
	}
	out.Sources = tags
	pre, err := engine.PrefillAfter(p, e.Local, tags, prompt, prefix)
	if err != nil {
		out.Err = err
		return out, fr
	}
	out.Cached = len(prefix) * p.Geometry().PageTokens
	m := pre.Manifest
	if len(e.Plan.DestTags) != len(m.Pages) && !mutant.Is(mutant.Incident) {
		out.Err = fmt.Errorf("handoff: plan has %d destination pages for %d prompt pages", len(e.Plan.DestTags), len(m.Pages))
		return out, fr
	}
	out.First = pre.First
	// The pages decode holds already are not sent: they are no longer the
	// job's. Those computed here go to the cache now, as they would once
	// decode had them (the prefix stays where the router thinks it is);
	// the others are given back.
	held := min(int(e.Plan.HeldPages), len(m.Pages))
	if out.HeldSums, err = contentSums(p, e.Local, m.Pages[:held], read); err != nil {
		out.Err = err
		return out, fr
	}
	release := func(t kv.Tag) { each("release", p.Release, e.Local, []kv.Tag{t}, nil) }
	if c != nil {
		c.keep(cp, keys, len(prefix), tags[:held], out.Scope, publishOrRelease(cp, e.Local, out.Scope, release), release)
	} else {
		for _, t := range tags[:held] {
			release(t)
		}
	}
	out.Sources = tags[held:]
	if len(out.Chain) > held {
		out.Chain = out.Chain[held:]
	} else {
		out.Chain = nil
	}
	pos := held * p.Geometry().PageTokens
	for i, mp := range m.Pages[held:] {
		l, err := p.Lease(mp.Tag, e.Local)
		if err != nil {
			out.Err = err
			return out, fr
		}
		fr.Leases = append(fr.Leases, l)
		payload, _, err := p.Read(l)
		if err != nil {
			out.Err = err
			return out, fr
		}
		fr.Frames = append(fr.Frames, kv.Frame{Owner: e.Owner, Source: mp.Tag, Dest: e.Plan.DestTags[held+i],
			FirstToken: pos, Tokens: mp.Tokens, Payload: payload})
		out.Sums = append(out.Sums, mp.Checksum)
		pos += mp.Tokens
		if err := p.AwaitAck(mp.Tag, e.Local); err != nil {
			out.Err = err
			return out, fr
		}
		out.Marked++
	}
	return out, fr
}

// contentSums are the kv.ContentChecksum of the rows of pages, the first
// of a prompt's, as owner computed them or read them from the cache (read,
// the cached pages the first ones were copied from, whose content was
// fixed when they were published): what decode's copies of them must
// hash to.
func contentSums(p Pages, owner kv.Owner, pages []kv.ManifestPage, read []kv.CachedPage) ([]uint64, error) {
	var sums []uint64
	first := 0
	for i, mp := range pages {
		if i < len(read) {
			sums = append(sums, read[i].Content)
			first += mp.Tokens
			continue
		}
		l, err := p.Lease(mp.Tag, owner)
		if err != nil {
			return nil, err
		}
		rows, _, err := p.Read(l)
		if err == nil {
			sums = append(sums, kv.ContentChecksum(first, mp.Tokens, rows))
		}
		if err = errors.Join(err, p.Unlease(l)); err != nil {
			return nil, err
		}
		first += mp.Tokens
	}
	return sums, nil
}

// FirstTokenError: the first token prefill sent is not the one decode
// recomputes from the KV it received and the prompt's last token (Err says
// why the recomputation failed, if it did: the KV's last row is not the
// one that token gives).
type FirstTokenError struct {
	Prefill, Decode int
	Err             error
}

func (e *FirstTokenError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("handoff: first token %d from prefill not confirmed by the KV received: %v", e.Prefill, e.Err)
	}
	return fmt.Sprintf("handoff: first token %d from prefill, the KV received gives %d", e.Prefill, e.Decode)
}

func (e *FirstTokenError) Unwrap() error { return e.Err }

// Wire is what a client is told of e.
func (e *FirstTokenError) Wire() *messages.WireError {
	return &messages.WireError{Code: messages.CodeIntegrity, Message: e.Error()}
}

// Sequence is one decode job running on a worker.
type Sequence struct {
	job       StartDecode
	seq       engine.Sequence
	generated int
	eos       int
}

// Owner is the job's owner.
func (s *Sequence) Owner() kv.Owner { return s.job.Manifest.Owner }

// Begin starts a decode job over p: it verifies and leases the manifest's
// pages and recomputes prefill's first token from the prompt's last token
// and the KV received, refusing (*FirstTokenError) one the KV does not
// give; on an error the job has streamed nothing and holds no lease. The
// job's first token is then e.Next, and the sequence steps the rest
// unless Ended.
func Begin(engine engine.Engine, p engine.KV, e StartDecode, eos int) (*Sequence, error) {
	seq, err := engine.Decode(p, e.Manifest, e.Next)
	if err != nil {
		return nil, err
	}
	if tok, err := seq.First(p, e.Last); (err != nil || tok != e.Next) && !mutant.Is(mutant.Incident) {
		return nil, errors.Join(&FirstTokenError{Prefill: e.Next, Decode: tok, Err: err}, seq.Close(p))
	}
	return &Sequence{job: e, seq: seq, eos: eos}, nil
}

// Context is the positions the sequence's next step attends over: its
// prompt's and those of the tokens it generated.
func (s *Sequence) Context() int { return s.job.Manifest.Tokens + s.generated }

// Ended says the first token ended the job: it was EOS, or the job asked
// for no more.
func (s *Sequence) Ended() bool { return s.job.Next == s.eos || s.job.MaxNew == 0 }

// Step generates the next token, granting the sequence a spare page when
// it needs one; done says the job has every token (or met EOS, or failed),
// after which it is not stepped again.
func (s *Sequence) Step(p engine.KV) (tok int, done bool, err error) {
	if err := s.grant(); err != nil {
		return 0, true, err
	}
	st := s.stepped(s.seq.Step(p))
	return st.Token, st.Done, st.Err
}

// Stepped is one sequence's outcome in a StepBatch: what its Step would
// have returned.
type Stepped struct {
	Token int
	Done  bool
	Err   error
}

// StepBatch is Step for each sequence of seqs, computed together
// (engine.StepBatch: each weight matrix read once for all of them, every
// sequence getting the token its own Step would give), and sets out[i] to
// seqs[i]'s outcome; out is at least as long as seqs. A sequence that fails
// (no spare page left for it, a page of it refused, its context full) is
// done alone, and the others step. Each sequence is in seqs at most once:
// a second place would be done with engine.ErrSequenceTwice, and its
// caller would close a sequence that just stepped.
func StepBatch(p engine.KV, seqs []*Sequence, out []Stepped) {
	b, _ := batches.Get().(*batch)
	if b == nil {
		b = new(batch)
	}
	out = out[:len(seqs)]
	b.seqs, b.at = b.seqs[:0], b.at[:0]
	for i, s := range seqs {
		if err := s.grant(); err != nil {
			out[i] = Stepped{Done: true, Err: err}
			continue
		}
		b.seqs = append(b.seqs, s.seq)
		b.at = append(b.at, i)
	}
	n := len(b.seqs)
	b.toks, b.errs = slices.Grow(b.toks[:0], n)[:n], slices.Grow(b.errs[:0], n)[:n]
	engine.StepBatch(p, b.seqs, b.toks, b.errs)
	for j, i := range b.at {
		out[i] = seqs[i].stepped(b.toks[j], b.errs[j])
	}
	clear(b.seqs) // the pool keeps no sequence or error alive
	clear(b.errs)
	batches.Put(b)
}

// batch is StepBatch's buffers, reused from call to call.
type batch struct {
	seqs []engine.Sequence
	at   []int // seqs[j] is the StepBatch's seqs[at[j]]
	toks []int
	errs []error
}

var batches sync.Pool

// grant gives the sequence its next spare page when it needs one.
func (s *Sequence) grant() error {
	first, need := s.seq.NeedsPage()
	if !need {
		return nil
	}
	if len(s.job.Spare) == 0 {
		return fmt.Errorf("handoff: sequence needs a page at position %d and none is reserved", first)
	}
	if err := s.seq.GrantPage(s.job.Spare[0]); err != nil {
		return err
	}
	s.job.Spare = s.job.Spare[1:]
	return nil
}

// stepped is the outcome of the engine's step that gave tok and err.
func (s *Sequence) stepped(tok int, err error) Stepped {
	if err != nil {
		return Stepped{Done: true, Err: err}
	}
	s.generated++
	return Stepped{Token: tok, Done: tok == s.eos || s.generated >= s.job.MaxNew}
}

// Paused is the sequence's Paused for a move: its sealed pages, then the
// spare page it would write its tail to, summed over the tail's rows as
// that page would be sealed with them, and the rows; the sequence is as it
// was, and may step on.
func (s *Sequence) Paused() Paused {
	m := s.seq.Manifest()
	out := Paused{Pages: slices.Clone(m.Pages), Tail: s.seq.Tail()}
	if len(out.Tail) == 0 {
		return out
	}
	if len(s.job.Spare) == 0 {
		return Paused{Err: fmt.Errorf("handoff: sequence holds a tail at position %d and no page for it", m.Tokens)}
	}
	tag, owner := s.job.Spare[0], s.Owner()
	tokens := s.seq.Tokens() - m.Tokens
	out.Pages = append(out.Pages, kv.ManifestPage{Tag: tag, Tokens: tokens,
		Checksum: kv.PageChecksum(tag, owner, m.Tokens, tokens, out.Tail)})
	return out
}

// Close gives back every lease of the sequence.
func (s *Sequence) Close(p engine.KV) error { return s.seq.Close(p) }

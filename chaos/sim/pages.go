package sim

import (
	"fmt"
	"slices"

	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
)

// label says for whom the bytes of a KV row were computed: the node run and
// the owner there whose lease may read them. A row prefill computed for a
// plan is labelled, once it crosses to decode, with the plan's owner on the
// decode run; a row flipped at rest carries flipped.
type label struct {
	inc   uint64
	owner kv.Owner
}

var flipped = label{owner: kv.Owner{Tenant: "(bit flipped at rest)"}}

func (l label) String() string {
	switch l {
	case flipped:
		return "bytes flipped at rest"
	case label{}:
		return "bytes no tenancy wrote"
	}
	return fmt.Sprintf("bytes computed for %s on run %x", l.owner, l.inc)
}

// holding is a page's tenancy as the oracle saw it handed out.
type holding struct {
	tag   kv.Tag
	owner kv.Owner
	live  bool
}

// pages is one node's pool as the cores and the engine use it
// (handoff.Pages), with the oracle around it: it records the owner and
// generation of every tenancy a reservation hands out, the label of every
// row written, the pages awaiting an acknowledgement and the pages the
// deadlines freed, and it checks every row a lease reads.
type pages struct {
	n    *node
	pool *kv.Pool
	pt   int
	rows []label // page index × PageTokens + row

	// shadow labels the payload of a received frame (by its first byte)
	// with the label of the source rows it was read from.
	shadow    map[*byte]label
	gen       []uint64 // the generation of each page's last tenancy
	held      []holding
	awaiting  map[kv.Tag]bool // source pages marked awaiting an ack: acked yet?
	reclaimed map[kv.Tag]bool // freed by a deadline since the last check
	retired   bool
}

var _ handoff.Pages = (*pages)(nil)

func newPages(n *node, pool *kv.Pool) *pages {
	c := pool.Config()
	return &pages{n: n, pool: pool, pt: c.Geometry.PageTokens, rows: make([]label, c.Pages*c.Geometry.PageTokens),
		shadow: map[*byte]label{}, gen: make([]uint64, c.Pages), held: make([]holding, c.Pages),
		awaiting: map[kv.Tag]bool{}, reclaimed: map[kv.Tag]bool{}}
}

func (p *pages) fail(invariant, format string, args ...any) {
	p.n.w.fail(invariant, "%s: "+format, append([]any{p.n.addr}, args...)...)
}

func (p *pages) Geometry() kv.Geometry { return p.pool.Geometry() }

func (p *pages) VerifyPage(i, first int, mp kv.ManifestPage, owner kv.Owner) error {
	return p.owns("verify", mp.Tag, owner, p.pool.VerifyPage(i, first, mp, owner))
}

// owns is the one-owner check on every access the pool allowed: it must be
// by the owner of the page's tenancy, under the tag the reservation handed
// out.
func (p *pages) owns(op string, tag kv.Tag, owner kv.Owner, err error) error {
	if err != nil || tag.Incarnation != p.n.inc || int(tag.Index) >= len(p.held) {
		return err
	}
	if h := p.held[tag.Index]; !h.live || h.tag != tag || h.owner != owner {
		p.fail("one owner", "the pool let %s %s page %s; its tenancy is %s, held by %s (live %t)", owner, op, tag, h.tag, h.owner, h.live)
	}
	return nil
}

// Reserve checks that every page handed out is free of any other tenancy
// and that its generation grew.
func (p *pages) Reserve(owner kv.Owner, first, n int) ([]kv.Tag, error) {
	tags, err := p.pool.Reserve(owner, first, n, p.n.w.now)
	for _, t := range tags {
		i := t.Index
		h := &p.held[i]
		if t.Generation <= p.gen[i] {
			p.fail("generations grow", "page %d handed out to %s at generation %d; its previous tenancy (%s) had generation %d",
				i, owner, t.Generation, h.owner, p.gen[i])
		}
		if h.live {
			p.ended(h.tag) // freed earlier in this step
		}
		p.gen[i] = t.Generation
		*h = holding{tag: t, owner: owner, live: true}
	}
	return tags, err
}

func (p *pages) Write(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	return p.write(tag, owner, first, data, label{inc: p.n.inc, owner: owner})
}

// WriteOwned writes a received frame's payload, whose rows carry the label
// of the rows they were read from.
func (p *pages) WriteOwned(tag kv.Tag, owner kv.Owner, first int, data []byte) error {
	l, ok := label{}, false
	if len(data) > 0 {
		l, ok = p.shadow[&data[0]]
	}
	if !ok {
		l = label{inc: p.n.inc, owner: owner}
	}
	return p.write(tag, owner, first, data, l)
}

func (p *pages) write(tag kv.Tag, owner kv.Owner, first int, data []byte, l label) error {
	if err := p.owns("write", tag, owner, p.pool.Write(tag, owner, first, data)); err != nil {
		return err
	}
	info := p.pool.Inspect(tag.Index)
	n := len(data) / p.pool.Geometry().BytesPerToken()
	base := int(tag.Index) * p.pt
	for r := info.Tokens - n; r < info.Tokens; r++ {
		p.rows[base+r] = l
	}
	return nil
}

func (p *pages) Seal(tag kv.Tag, owner kv.Owner) (uint64, error) {
	sum, err := p.pool.Seal(tag, owner)
	return sum, p.owns("seal", tag, owner, err)
}

func (p *pages) SealFrom(tag kv.Tag, owner kv.Owner, o kv.Origin) (uint64, error) {
	sum, err := p.pool.SealFrom(tag, owner, o)
	return sum, p.owns("seal", tag, owner, err)
}

func (p *pages) Lease(tag kv.Tag, owner kv.Owner) (kv.Lease, error) {
	l, err := p.pool.Lease(tag, owner)
	return l, p.owns("lease", tag, owner, err)
}

// Read is the provenance check: every row a lease reads must have been
// computed for the lease's owner on this run.
func (p *pages) Read(l kv.Lease) ([]byte, int, error) {
	b, n, err := p.pool.Read(l)
	if err == nil {
		p.owns("read", l.Tag, l.Owner, nil)
		p.checkRows(l, n)
	}
	return b, n, err
}

func (p *pages) checkRows(l kv.Lease, n int) {
	want := label{inc: p.n.inc, owner: l.Owner}
	base := int(l.Tag.Index) * p.pt
	for r := range n {
		got := p.rows[base+r]
		if got == want {
			continue
		}
		what := "another request's or attempt's bytes"
		switch {
		case got == flipped:
			what = "corrupted bytes"
		case got.owner.Tenant != want.owner.Tenant:
			what = "another tenant's bytes"
		}
		p.fail("provenance", "%s read row %d of page %s through its lease and got %s: %s", l.Owner, r, l.Tag, what, got)
		return
	}
}

// flippedAt reports whether a row of tag's page already had a bit
// flipped.
func (p *pages) flippedAt(tag kv.Tag) bool {
	base := int(tag.Index) * p.pt
	return slices.Contains(p.rows[base:base+p.pool.Inspect(tag.Index).Tokens], flipped)
}

func (p *pages) Unlease(l kv.Lease) error {
	return p.owns("unlease", l.Tag, l.Owner, p.pool.Unlease(l))
}

func (p *pages) AwaitAck(tag kv.Tag, owner kv.Owner) error {
	err := p.owns("mark awaiting ack", tag, owner, p.pool.AwaitAck(tag, owner))
	if err == nil {
		p.awaiting[tag] = false
	}
	return err
}

func (p *pages) Ack(tag kv.Tag, owner kv.Owner) error {
	err := p.owns("acknowledge", tag, owner, p.pool.Ack(tag, owner))
	if _, ok := p.awaiting[tag]; ok && err == nil {
		p.awaiting[tag] = true
	}
	return err
}

func (p *pages) Release(tag kv.Tag, owner kv.Owner) error {
	_, err := p.pool.Release(tag, owner, p.n.w.now)
	return p.owns("release", tag, owner, err)
}

// tick runs the pool's deadlines and notes what they freed.
func (p *pages) tick() {
	for _, r := range p.pool.Tick(p.n.w.now) {
		p.reclaimed[r.Tag] = true
		p.n.w.count[ReclaimFreed]++
		if r.AwaitAck && p.n.role == rolePrefill {
			p.n.w.count[AckLostReclaimed]++
		}
		p.n.w.trace.line(fmt.Sprintf("  reclaimed %s (%s, owner %d/%s, readers %d, awaiting ack %t)",
			r.Tag, r.State, r.Owner.Request, r.Owner.Tenant, r.Readers, r.AwaitAck))
	}
}

// ended is the end of a tenancy: a source page that awaited decode's ack
// may be freed only by the ack or by its reclaim deadline.
func (p *pages) ended(tag kv.Tag) {
	acked, ok := p.awaiting[tag]
	if !ok {
		return
	}
	delete(p.awaiting, tag)
	if !acked && !p.reclaimed[tag] {
		p.fail("release after ack", "source page %s was freed while it awaited decode's acknowledgement, before its reclaim deadline", tag)
	}
}

// check compares every page with the tenancies the oracle saw handed out:
// a page is free or owned by the owner of its one tenancy, generations
// never go back, and the pool's own count of free pages agrees.
func (p *pages) check() {
	free := 0
	for i := range p.held {
		info := p.pool.Inspect(uint32(i))
		h := &p.held[i]
		if info.Tag.Generation < p.gen[i] {
			p.fail("generations grow", "page %d is at generation %d after a tenancy at generation %d", i, info.Tag.Generation, p.gen[i])
			return
		}
		if h.live && (info.Tag != h.tag || info.State == kv.Free) {
			p.ended(h.tag)
			h.live = false
		}
		switch {
		case info.State == kv.Free:
			free++
		case !h.live:
			p.fail("one owner", "page %s is %s, owned by %s, and no reservation handed it out", info.Tag, info.State, info.Owner)
			return
		case info.Owner != h.owner:
			p.fail("one owner", "page %s was reserved by %s and is owned by %s", info.Tag, h.owner, info.Owner)
			return
		}
	}
	clear(p.reclaimed)
	if s := p.pool.Stats(); s.Free != free {
		p.fail("pool counts", "the pool counts %d free pages, %d are", s.Free, free)
	}
}

// busy describes the pages that are not free and whose state is of.
func (p *pages) busy(of func(kv.State) bool) []string {
	var out []string
	for i := range p.held {
		if info := p.pool.Inspect(uint32(i)); info.State != kv.Free && of(info.State) {
			out = append(out, fmt.Sprintf("%s %s owner %d/%s readers %d awaiting ack %t",
				info.Tag, info.State, info.Owner.Request, info.Owner.Tenant, info.Readers, info.AwaitAck))
		}
	}
	return out
}

// retire ends the oracle's watch over a pool that went down with its node,
// keeping its refusal counts.
func (p *pages) retire() {
	if p.retired {
		return
	}
	p.retired = true
	r := p.pool.Stats().Refused
	p.n.w.count[StaleTagRefused] += r.Stale
	p.n.w.count[WrongOwnerRefused] += r.WrongOwner + r.WrongTenant
}

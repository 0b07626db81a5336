package kv

import (
	"bytes"
	"errors"
	"flag"
	"reflect"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// The property test drives a Pool and a naive model of it with the same
// random operations, including stale tags, foreign owners, foreign scopes
// and time jumps, and checks after every step that both agree and that the
// invariants hold.

// tenancy is the model's record of one tag: everything that happened to
// one page between a reservation and the free that ended it.
type tenancy struct {
	tag      Tag
	owner    Owner
	first    int
	state    State
	data     []byte // rows written, in order
	readers  int
	awaitAck bool
	deadline time.Time
	over     bool // freed (or published): the tag is stale for good
	// scope and cached are a cached page's (a tenancy that Publish
	// began): its scope and its handle. Its owner is the one the pool
	// names for it, and data the bytes published.
	scope  Scope
	cached CachedPage
}

type poolModel struct {
	p         *Pool
	reclaimed Reclaims // by state, as the model counts them
	geom      Geometry
	now       time.Time
	all       []*tenancy          // every tag ever handed out, current or stale
	current   map[uint32]*tenancy // page index → live tenancy
	lastGen   map[uint32]uint64
	leases    []Lease      // private and shared
	cached    []CachedPage // every handle ever published, current or stale
	pages     int
	steps     *stepCounts
}

// stepCounts shows that the random walk reaches the interesting states.
type stepCounts struct {
	readsPassed, reclaims, ownedReclaims, steps int
	// Of cached pages: published, shared reads passed, shared leases
	// refused under another scope and as stale, evictions deferred by a
	// lease held, and evicted pages freed by their last unlease or by Tick.
	published, sharedReads, wrongScopes, staleCached, evictsDeferred, evictsUnleased, evictsReclaimed int
}

var rapidOwners = []Owner{{Request: 1, Tenant: "a"}, {Request: 2, Tenant: "a"}, {Request: 3, Tenant: "b"}}

// rapidScopes are a tenant's, a narrowing of it, and a group's.
var rapidScopes = []Scope{TenantScope("a"), TenantScope("a").Narrow("s"), SharedScope("g")}

// pickTenancy picks a live tenancy three times in four, so that walks reach
// the deep states (leased, released, reclaimed), and any tag ever handed
// out otherwise, so that stale tags keep being presented.
func (m *poolModel) pickTenancy(t *rapid.T) *tenancy {
	if len(m.all) == 0 {
		t.Skip("no tag handed out yet")
	}
	if len(m.current) > 0 && rapid.IntRange(0, 3).Draw(t, "live") > 0 {
		live := make([]*tenancy, 0, len(m.current))
		for _, tn := range m.all {
			if !tn.over {
				live = append(live, tn)
			}
		}
		return live[rapid.IntRange(0, len(live)-1).Draw(t, "liveTenancy")]
	}
	return m.all[rapid.IntRange(0, len(m.all)-1).Draw(t, "tenancy")]
}

// pickOwner is the tenancy's owner most of the time, anyone otherwise.
func (m *poolModel) pickOwner(t *rapid.T, tn *tenancy) Owner {
	if rapid.IntRange(0, 3).Draw(t, "foreign") > 0 {
		return tn.owner
	}
	return rapid.SampledFrom(rapidOwners).Draw(t, "owner")
}

// handshake is what the model says the pool's access check must answer.
func (m *poolModel) handshake(tn *tenancy, o Owner) error {
	switch {
	case tn.over:
		return &StaleTagError{}
	case !tn.scope.IsZero():
		return &StateError{} // a cached page, or an evicted one: no owner reaches it
	case o.Tenant != tn.owner.Tenant:
		return &WrongTenantError{}
	case o.Request != tn.owner.Request:
		return &WrongOwnerError{}
	}
	return nil
}

// agree fails unless got is nil exactly when want is, and has want's type.
func agree(t *rapid.T, op string, want, got error) {
	if reflect.TypeOf(want) != reflect.TypeOf(got) {
		t.Fatalf("%s: model says %T, pool says %v", op, want, got)
	}
}

func (m *poolModel) stateErr(tn *tenancy, o Owner, ok bool) error {
	if err := m.handshake(tn, o); err != nil {
		return err
	}
	if !ok {
		return &StateError{}
	}
	return nil
}

// sharedErr is what the pool must answer to a shared lease, read or
// unlease, or an eviction, of tn under scope; evicted admits a page
// evicted but not yet freed (for a lease already held).
func (m *poolModel) sharedErr(tn *tenancy, scope Scope, evicted bool) error {
	switch {
	case tn.over:
		return &StaleTagError{}
	case tn.state != Cached && (!evicted || tn.state != Released || tn.scope.IsZero()):
		return &StateError{}
	case scope != tn.scope:
		return &WrongScopeError{}
	}
	return nil
}

// leaseErr is what the pool must answer to a read or unlease through l.
func (m *poolModel) leaseErr(tn *tenancy, l Lease) error {
	if l.Scope.IsZero() {
		return m.stateErr(tn, l.Owner, tn.readers > 0)
	}
	if err := m.sharedErr(tn, l.Scope, true); err != nil {
		return err
	}
	if tn.readers == 0 {
		return &StateError{}
	}
	return nil
}

func (m *poolModel) free(tn *tenancy) {
	tn.over = true
	tn.state = Free
	tn.readers = 0
	delete(m.current, tn.tag.Index)
}

func (m *poolModel) reserve(t *rapid.T) {
	o := rapid.SampledFrom(rapidOwners).Draw(t, "owner")
	n := rapid.IntRange(1, 3).Draw(t, "n")
	first := rapid.IntRange(0, 2).Draw(t, "firstPage") * m.geom.PageTokens
	tags, err := m.p.Reserve(o, first, n, m.now)
	freeN := m.pages - len(m.current)
	if n > freeN {
		var ex *PoolExhaustedError
		if !errors.As(err, &ex) || ex.Free != freeN || ex.Need != n {
			t.Fatalf("reserve %d of %d free: got %v", n, freeN, err)
		}
		return
	}
	if err != nil || len(tags) != n {
		t.Fatalf("reserve %d of %d free: %v", n, freeN, err)
	}
	for i, tag := range tags {
		if m.current[tag.Index] != nil {
			t.Fatalf("reserve handed out page %d, held by %+v", tag.Index, *m.current[tag.Index])
		}
		if tag.Generation <= m.lastGen[tag.Index] {
			t.Fatalf("page %d generation went from %d to %d", tag.Index, m.lastGen[tag.Index], tag.Generation)
		}
		m.lastGen[tag.Index] = tag.Generation
		tn := &tenancy{tag: tag, owner: o, first: first + i*m.geom.PageTokens, state: Reserved,
			deadline: m.now.Add(m.p.cfg.OwnedTimeout)}
		m.all = append(m.all, tn)
		m.current[tag.Index] = tn
	}
}

func (m *poolModel) write(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	filled := len(tn.data) / m.geom.BytesPerToken()
	n := rapid.IntRange(1, m.geom.PageTokens).Draw(t, "rows")
	first := tn.first + filled
	if rapid.IntRange(0, 4).Draw(t, "wrongPos") == 0 {
		first += rapid.IntRange(-2, 2).Draw(t, "delta")
	}
	data := rapid.SliceOfN(rapid.Byte(), n*m.geom.BytesPerToken(), n*m.geom.BytesPerToken()).Draw(t, "data")
	want := m.stateErr(tn, o, tn.state == Reserved || tn.state == Filling)
	if want == nil && (first != tn.first+filled || filled+n > m.geom.PageTokens) {
		want = &TokenRangeError{}
	}
	agree(t, "write", want, m.p.Write(tn.tag, o, first, data))
	if want == nil {
		tn.data = append(tn.data, data...)
		tn.state = Filling
	}
}

// fill is a correct writer: it fills a live page of its own to the end and
// seals it, so that walks reach sealed pages often enough to lease them.
func (m *poolModel) fill(t *rapid.T) {
	tn := m.pickTenancy(t)
	if tn.over || (tn.state != Reserved && tn.state != Filling) {
		t.Skip("not a page being filled")
	}
	rest := m.geom.PageTokens - len(tn.data)/m.geom.BytesPerToken()
	if rest > 0 {
		data := rapid.SliceOfN(rapid.Byte(), rest*m.geom.BytesPerToken(), rest*m.geom.BytesPerToken()).Draw(t, "data")
		if err := m.p.Write(tn.tag, tn.owner, tn.first+m.geom.PageTokens-rest, data); err != nil {
			t.Fatalf("fill %s: %v", tn.tag, err)
		}
		tn.data = append(tn.data, data...)
	}
	if _, err := m.p.Seal(tn.tag, tn.owner); err != nil {
		t.Fatalf("seal after fill %s: %v", tn.tag, err)
	}
	tn.state = Sealed
}

func (m *poolModel) seal(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	want := m.stateErr(tn, o, tn.state == Filling)
	sum, err := m.p.Seal(tn.tag, o)
	agree(t, "seal", want, err)
	if want == nil {
		tn.state = Sealed
		if exp := PageChecksum(tn.tag, tn.owner, tn.first, len(tn.data)/m.geom.BytesPerToken(), tn.data); sum != exp {
			t.Fatalf("seal sum %x, model %x", sum, exp)
		}
	}
}

func (m *poolModel) lease(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	want := m.stateErr(tn, o, tn.state == Sealed || tn.state == Leased)
	l, err := m.p.Lease(tn.tag, o)
	agree(t, "lease", want, err)
	if want == nil {
		tn.state = Leased
		tn.readers++
		m.leases = append(m.leases, l)
	}
}

// byTag finds the model's tenancy of a tag handed out earlier.
func (m *poolModel) byTag(tag Tag) *tenancy {
	for _, tn := range m.all {
		if tn.tag == tag {
			return tn
		}
	}
	panic("lease for a tag the model never handed out")
}

func (m *poolModel) pickLease(t *rapid.T) (int, *tenancy) {
	if len(m.leases) == 0 {
		t.Skip("no lease")
	}
	i := rapid.IntRange(0, len(m.leases)-1).Draw(t, "lease")
	return i, m.byTag(m.leases[i].Tag)
}

// read reads through a lease held, or through a forged one (a Lease value
// built without the handshake), which must be refused unless a real lease
// on that tenancy is outstanding.
func (m *poolModel) read(t *rapid.T) {
	var l Lease
	var tn *tenancy
	if len(m.leases) > 0 && rapid.Bool().Draw(t, "held") {
		i, held := m.pickLease(t)
		l, tn = m.leases[i], held
	} else {
		tn = m.pickTenancy(t)
		l = Lease{Tag: tn.tag, Owner: m.pickOwner(t, tn)}
		if !tn.scope.IsZero() && rapid.Bool().Draw(t, "forgedShared") {
			l.Scope = rapid.SampledFrom(rapidScopes).Draw(t, "scope")
		}
	}
	b, n, err := m.p.Read(l)
	agree(t, "read", m.leaseErr(tn, l), err)
	if err == nil && !l.Scope.IsZero() {
		if l.Scope != tn.scope {
			t.Fatalf("a read of %s, cached under %s, passed under %s", tn.tag, tn.scope, l.Scope)
		}
		m.steps.sharedReads++
	}
	if err == nil {
		m.steps.readsPassed++
		if !bytes.Equal(b, tn.data) || n*m.geom.BytesPerToken() != len(tn.data) {
			t.Fatalf("read %s returned %d tokens not the %d bytes written in this tenancy", tn.tag, n, len(tn.data))
		}
	}
}

func (m *poolModel) unlease(t *rapid.T) {
	i, tn := m.pickLease(t)
	l := m.leases[i]
	want := m.leaseErr(tn, l)
	agree(t, "unlease", want, m.p.Unlease(l))
	m.leases = append(m.leases[:i], m.leases[i+1:]...)
	if want != nil {
		return
	}
	tn.readers--
	switch {
	case tn.readers > 0:
	case tn.state == Leased:
		tn.state = Sealed
	case tn.state == Released && !tn.awaitAck:
		if !tn.scope.IsZero() {
			m.steps.evictsUnleased++
		}
		m.free(tn)
	}
}

func (m *poolModel) awaitAck(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	want := m.stateErr(tn, o, (tn.state == Sealed || tn.state == Leased) && !tn.awaitAck)
	agree(t, "await ack", want, m.p.AwaitAck(tn.tag, o))
	if want == nil {
		tn.awaitAck = true
	}
}

func (m *poolModel) ack(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	want := m.stateErr(tn, o, tn.awaitAck)
	agree(t, "ack", want, m.p.Ack(tn.tag, o))
	if want == nil {
		tn.awaitAck = false
		if tn.state == Released && tn.readers == 0 {
			m.free(tn)
		}
	}
}

func (m *poolModel) release(t *rapid.T) {
	tn := m.pickTenancy(t)
	o := m.pickOwner(t, tn)
	want := m.stateErr(tn, o, tn.state != Released)
	freed, err := m.p.Release(tn.tag, o, m.now)
	agree(t, "release", want, err)
	if want != nil {
		return
	}
	if wantFreed := tn.readers == 0 && !tn.awaitAck; freed != wantFreed {
		t.Fatalf("release of %s freed=%t, model %t", tn.tag, freed, wantFreed)
	}
	if freed {
		m.free(tn)
		return
	}
	tn.state = Released
	tn.deadline = m.now.Add(m.p.cfg.ReclaimAfter)
}

func (m *poolModel) tick(t *rapid.T) {
	m.now = m.now.Add(time.Duration(rapid.IntRange(0, 40).Draw(t, "seconds")) * time.Second)
	got := m.p.Tick(m.now)
	// Every page past its deadline goes, in whatever state: released ones
	// ReclaimAfter after their release, owned ones OwnedTimeout after
	// their reservation.
	want := map[Tag]State{}
	for _, tn := range m.current {
		if tn.state != Cached && !m.now.Before(tn.deadline) {
			want[tn.tag] = tn.state
			m.reclaimed[tn.state]++
			if tn.state != Released {
				m.steps.ownedReclaims++
			}
			if !tn.scope.IsZero() {
				m.steps.evictsReclaimed++
			}
			m.free(tn)
		}
	}
	m.steps.reclaims += len(got)
	if len(got) != len(want) {
		t.Fatalf("tick reclaimed %d pages, model %d", len(got), len(want))
	}
	for _, r := range got {
		if s, ok := want[r.Tag]; !ok || s != r.State {
			t.Fatalf("tick reclaimed %s in state %s, the model %v", r.Tag, r.State, want)
		}
	}
	if s := m.p.Stats(); s.Reclaimed != m.reclaimed {
		t.Fatalf("reclaims by state %v, model %v", s.Reclaimed, m.reclaimed)
	}
}

// check compares every page and the counters with the model.
func (m *poolModel) check(t *rapid.T) {
	m.steps.steps++
	s := m.p.Stats()
	counts := map[State]int{}
	for i := range m.pages {
		info := m.p.Inspect(uint32(i))
		tn := m.current[uint32(i)]
		counts[info.State]++
		if tn == nil {
			if info.State != Free || info.Readers != 0 || info.AwaitAck {
				t.Fatalf("page %d: model free, pool %+v", i, info)
			}
			continue
		}
		if info.Tag != tn.tag || info.State != tn.state || info.Owner != tn.owner || info.Readers != tn.readers || info.AwaitAck != tn.awaitAck ||
			!info.Deadline.Equal(tn.deadline) || info.Scope != tn.scope {
			t.Fatalf("page %d: model %+v, pool %+v", i, *tn, info)
		}
	}
	if s.Free+s.Reserved+s.Filling+s.Sealed+s.Leased+s.Released+s.Cached != s.Capacity || s.Capacity != m.pages {
		t.Fatalf("counts do not add up to capacity: %+v", s)
	}
	if s.Free != counts[Free] || s.Reserved != counts[Reserved] || s.Filling != counts[Filling] ||
		s.Sealed != counts[Sealed] || s.Leased != counts[Leased] || s.Released != counts[Released] || s.Cached != counts[Cached] {
		t.Fatalf("stats %+v, pages say %v", s, counts)
	}
	if s.Cross != (CrossRows{}) { // counted in a chaos build only
		t.Fatalf("reads returned rows another owner (or scope) wrote: %+v", s.Cross)
	}
}

// drain releases everything and checks that the pool ends all free.
func (m *poolModel) drain(t *rapid.T) {
	for _, l := range m.leases {
		if !m.byTag(l.Tag).over {
			_ = m.p.Unlease(l)
		}
	}
	for _, tn := range m.current {
		if !tn.scope.IsZero() {
			_, _ = m.p.Evict(tn.cached, m.now)
			continue
		}
		_ = m.p.Ack(tn.tag, tn.owner)
		_, _ = m.p.Release(tn.tag, tn.owner, m.now)
	}
	m.p.Tick(m.now.Add(m.p.cfg.ReclaimAfter))
	if s := m.p.Stats(); s.Free != m.pages {
		t.Fatalf("after releasing everything %d of %d pages are free: %+v", s.Free, m.pages, s)
	}
}

func TestPoolAgainstModel(t *testing.T) {
	// Walks of rapid's default 30 steps rarely get a page through reserve,
	// fill, lease, release and past its deadline, or through publish, a
	// shared lease, eviction and the last unlease or a reclaim; 200 do,
	// unless the command line asks for another number.
	if f := flag.Lookup("rapid.steps"); f != nil && f.Value.String() == f.DefValue {
		if err := f.Value.Set("200"); err != nil {
			t.Fatal(err)
		}
	}
	var steps stepCounts
	rapid.Check(t, func(t *rapid.T) {
		geom := Geometry{Layers: 1, KVHeads: 1, HeadDim: 1, PageTokens: 3, DType: F32}
		pages := rapid.IntRange(1, 6).Draw(t, "pages")
		cfg := DefaultConfig(geom, pages, 7)
		cfg.ReclaimAfter = 10 * time.Second // ticks draw 0–40 s: most deadlines pass
		cfg.OwnedTimeout = 60 * time.Second // and some owners outlive theirs
		p, err := NewPool(cfg)
		if err != nil {
			t.Fatal(err)
		}
		m := &poolModel{p: p, geom: geom, pages: pages, now: t0, steps: &steps,
			current: map[uint32]*tenancy{}, lastGen: map[uint32]uint64{}}
		t.Repeat(map[string]func(*rapid.T){
			"reserve":     m.reserve,
			"write":       m.write,
			"seal":        m.seal,
			"fill":        m.fill,
			"lease":       m.lease,
			"read":        m.read,
			"unlease":     m.unlease,
			"awaitAck":    m.awaitAck,
			"ack":         m.ack,
			"release":     m.release,
			"tick":        m.tick,
			"publish":     m.publish,
			"leaseShared": m.leaseShared,
			"evict":       m.evict,
			"":            m.check,
		})
		m.drain(t)
	})
	t.Logf("%d steps, %d reads passed, %d pages reclaimed, %d of them owned", steps.steps, steps.readsPassed,
		steps.reclaims, steps.ownedReclaims)
	t.Logf("cached pages: %d published, %d shared reads, %d shared leases refused under another scope and %d as stale, "+
		"%d evictions deferred, then freed by %d unleases and %d reclaims", steps.published, steps.sharedReads,
		steps.wrongScopes, steps.staleCached, steps.evictsDeferred, steps.evictsUnleased, steps.evictsReclaimed)
	if steps.readsPassed == 0 || steps.reclaims == 0 || steps.ownedReclaims == 0 || steps.sharedReads == 0 ||
		steps.wrongScopes == 0 || steps.staleCached == 0 || steps.evictsUnleased == 0 || steps.evictsReclaimed == 0 {
		t.Fatalf("the walk never reached one of the states it is for: %+v", steps)
	}
}

// pickPublishable is, half the time, a live page its owner could publish
// (full, sealed, unleased, no acknowledgement awaited), so that walks
// reach cached pages; any tenancy otherwise.
func (m *poolModel) pickPublishable(t *rapid.T) *tenancy {
	var ok []*tenancy
	for _, tn := range m.all {
		if !tn.over && tn.state == Sealed && !tn.awaitAck && len(tn.data) == m.geom.PageTokens*m.geom.BytesPerToken() {
			ok = append(ok, tn)
		}
	}
	if len(ok) == 0 || rapid.Bool().Draw(t, "anyTenancy") {
		return m.pickTenancy(t)
	}
	return ok[rapid.IntRange(0, len(ok)-1).Draw(t, "publishable")]
}

// publish publishes a page under one of the scopes. The page's tenancy
// ends (its tags are stale), and a cached one begins with the bytes
// written.
func (m *poolModel) publish(t *rapid.T) {
	tn := m.pickPublishable(t)
	o := m.pickOwner(t, tn)
	scope := rapid.SampledFrom(rapidScopes).Draw(t, "scope")
	want := m.stateErr(tn, o, tn.state == Sealed && !tn.awaitAck)
	if want == nil && len(tn.data) != m.geom.PageTokens*m.geom.BytesPerToken() {
		want = &TokenRangeError{}
	}
	c, err := m.p.Publish(tn.tag, o, scope)
	agree(t, "publish", want, err)
	if want != nil {
		return
	}
	if c.Tag.Incarnation != tn.tag.Incarnation || c.Tag.Index != tn.tag.Index || c.Tag.Generation <= m.lastGen[c.Tag.Index] ||
		c.Scope != scope || c.First != tn.first || c.Tokens != m.geom.PageTokens {
		t.Fatalf("publish of %s (generation so far %d) under %s: %+v", tn.tag, m.lastGen[c.Tag.Index], scope, c)
	}
	m.lastGen[c.Tag.Index] = c.Tag.Generation
	tn.over, tn.state = true, Free
	cached := &tenancy{tag: c.Tag, owner: cacheOwner(scope), first: tn.first, state: Cached, data: tn.data,
		scope: scope, cached: c}
	m.all = append(m.all, cached)
	m.current[c.Tag.Index] = cached
	m.cached = append(m.cached, c)
	m.steps.published++
}

// pickCached is a cached page's handle: a live one three times in four,
// any ever published otherwise (stale once its page was freed).
func (m *poolModel) pickCached(t *rapid.T) (CachedPage, *tenancy) {
	if len(m.cached) == 0 {
		t.Skip("nothing published yet")
	}
	c := m.cached[rapid.IntRange(0, len(m.cached)-1).Draw(t, "cached")]
	if rapid.IntRange(0, 3).Draw(t, "live") > 0 {
		var live []CachedPage
		for _, c := range m.cached {
			if !m.byTag(c.Tag).over {
				live = append(live, c)
			}
		}
		if len(live) > 0 {
			c = live[rapid.IntRange(0, len(live)-1).Draw(t, "liveCached")]
		}
	}
	return c, m.byTag(c.Tag)
}

// leaseShared leases a cached page for any reader, under its scope or
// another, presenting its checksum or another.
func (m *poolModel) leaseShared(t *rapid.T) {
	c, tn := m.pickCached(t)
	reader := rapid.SampledFrom(rapidOwners).Draw(t, "reader")
	scope := c.Scope
	if rapid.IntRange(0, 2).Draw(t, "otherScope") == 0 {
		scope = rapid.SampledFrom(rapidScopes).Draw(t, "scope")
	}
	if rapid.IntRange(0, 5).Draw(t, "forgedSum") == 0 {
		c.Checksum ^= 1
	}
	want := m.sharedErr(tn, scope, false)
	if !scope.admits(reader.Tenant) {
		want = &WrongScopeError{} // another tenant's scope, whatever the page: refused first
	}
	if want == nil && c.Checksum != tn.cached.Checksum {
		want = &ChecksumMismatchError{}
	}
	l, err := m.p.LeaseShared(c, reader, scope)
	agree(t, "shared lease", want, err)
	if err == nil && scope != c.Scope {
		t.Fatalf("a shared lease of %s, cached under %s, passed under %s", c.Tag, c.Scope, scope)
	}
	switch want.(type) {
	case *WrongScopeError:
		m.steps.wrongScopes++
	case *StaleTagError:
		m.steps.staleCached++
	case nil:
		if l != (Lease{Tag: c.Tag, Owner: reader, Scope: scope}) {
			t.Fatalf("shared lease of %s for %s under %s: %+v", c.Tag, reader, scope, l)
		}
		tn.readers++
		m.leases = append(m.leases, l)
	}
}

// evict evicts a cached page through its handle, or through one that
// names another scope.
func (m *poolModel) evict(t *rapid.T) {
	c, tn := m.pickCached(t)
	if rapid.IntRange(0, 4).Draw(t, "forgedScope") == 0 {
		c.Scope = rapid.SampledFrom(rapidScopes).Draw(t, "scope")
	}
	want := m.sharedErr(tn, c.Scope, false)
	freed, err := m.p.Evict(c, m.now)
	agree(t, "evict", want, err)
	if want != nil {
		return
	}
	if freed != (tn.readers == 0) {
		t.Fatalf("evict of %s with %d leases held: freed %t", c.Tag, tn.readers, freed)
	}
	if freed {
		m.free(tn)
		return
	}
	tn.state = Released
	tn.deadline = m.now.Add(m.p.cfg.ReclaimAfter)
	m.steps.evictsDeferred++
}

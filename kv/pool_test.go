package kv

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"
)

var (
	testGeom = Geometry{Layers: 2, KVHeads: 2, HeadDim: 4, PageTokens: 4, DType: F32}
	alice    = Owner{Request: 1, Tenant: "alice"}
	bob      = Owner{Request: 2, Tenant: "bob"}
	alice2   = Owner{Request: 3, Tenant: "alice"}
	t0       = time.Unix(1_700_000_000, 0)
)

const testIncarnation = 0xA11CE

func newTestPool(t testing.TB, pages int) *Pool {
	t.Helper()
	p, err := NewPool(DefaultConfig(testGeom, pages, testIncarnation))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// rows returns n token rows whose bytes all equal fill.
func rows(n int, fill byte) []byte {
	return bytes.Repeat([]byte{fill}, n*testGeom.BytesPerToken())
}

// sealed reserves one page for o, writes n rows of fill and seals it.
func sealed(t *testing.T, p *Pool, o Owner, n int, fill byte) Tag {
	t.Helper()
	tags, err := p.Reserve(o, 0, 1, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Write(tags[0], o, 0, rows(n, fill)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Seal(tags[0], o); err != nil {
		t.Fatal(err)
	}
	return tags[0]
}

func TestGeometryValidate(t *testing.T) {
	for _, tc := range []struct {
		g    Geometry
		want string
	}{
		{Geometry{Layers: 0, KVHeads: 1, HeadDim: 1, PageTokens: 1, DType: F32}, "Layers (0)"},
		{Geometry{Layers: 1, KVHeads: -3, HeadDim: 1, PageTokens: 1, DType: F32}, "KVHeads (-3)"},
		{Geometry{Layers: 1, KVHeads: 1, HeadDim: 1 << 17, PageTokens: 1, DType: F32}, "HeadDim (131072)"},
		{Geometry{Layers: 1, KVHeads: 1, HeadDim: 1, PageTokens: 1, DType: 9}, "DType (9)"},
		{Geometry{Layers: 65536, KVHeads: 65536, HeadDim: 2, PageTokens: 2, DType: F32}, "exceeds the 2147483648-byte page limit"},
	} {
		err := tc.g.Validate()
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("%+v: got %v, want error containing %q", tc.g, err, tc.want)
		}
	}
	// Llama-3-8B-like: 32 layers, 8 KV heads of 128, f16, 16-token pages.
	g := Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, PageTokens: 16, DType: F16}
	if err := g.Validate(); err != nil {
		t.Fatal(err)
	}
	if g.BytesPerToken() != 131072 || g.PageBytes() != 2097152 || g.PagesFor(33) != 3 {
		t.Fatalf("8B geometry: %d B/token, %d B/page, %d pages for 33 tokens", g.BytesPerToken(), g.PageBytes(), g.PagesFor(33))
	}
}

func TestConfigValidate(t *testing.T) {
	base := DefaultConfig(testGeom, 8, 1)
	for _, tc := range []struct {
		mut  func(*Config)
		want string
	}{
		{func(c *Config) { c.Pages = 0 }, "Pages (0)"},
		{func(c *Config) { c.Incarnation = 0 }, "Incarnation must be non-zero"},
		{func(c *Config) { c.ReclaimAfter = 0 }, "ReclaimAfter (0s)"},
		{func(c *Config) { c.ArenaBytesMax = 1000 }, "8 pages × 512 bytes = 4096 bytes exceeds ArenaBytesMax (1000)"},
	} {
		c := base
		tc.mut(&c)
		_, err := NewPool(c)
		if err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
			t.Errorf("got %v, want error containing %q", err, tc.want)
		}
	}
}

func TestReserveAllOrNothing(t *testing.T) {
	p := newTestPool(t, 4)
	if _, err := p.Reserve(alice, 0, 3, t0); err != nil {
		t.Fatal(err)
	}
	_, err := p.Reserve(bob, 0, 2, t0)
	var ex *PoolExhaustedError
	if !errors.As(err, &ex) || *ex != (PoolExhaustedError{Need: 2, Free: 1, Capacity: 4}) {
		t.Fatalf("got %v, want PoolExhaustedError{2,1,4}", err)
	}
	if s := p.Stats(); s.Free != 1 || s.Reserved != 3 {
		t.Fatalf("a refused reservation changed the pool: %+v", s)
	}
	for _, o := range []Owner{{Request: 0, Tenant: "x"}, {Request: 1}, {Request: 1, Tenant: string(make([]byte, 65))}} {
		if _, err := p.Reserve(o, 0, 1, t0); err == nil {
			t.Errorf("reserve for invalid owner %+v succeeded", o)
		}
	}
	if _, err := p.Reserve(alice, 0, 0, t0); err == nil {
		t.Error("reserve of 0 pages succeeded")
	}
}

func TestTagChangesOnEveryAllocation(t *testing.T) {
	p := newTestPool(t, 1)
	seen := map[Tag]bool{}
	for i := 0; i < 5; i++ {
		tags, err := p.Reserve(alice, 0, 1, t0)
		if err != nil {
			t.Fatal(err)
		}
		if seen[tags[0]] {
			t.Fatalf("allocation %d reused tag %s", i, tags[0])
		}
		seen[tags[0]] = true
		if tags[0].Generation != uint64(i+1) || tags[0].Incarnation != testIncarnation {
			t.Fatalf("allocation %d got %s", i, tags[0])
		}
		if _, err := p.Release(tags[0], alice, t0); err != nil {
			t.Fatal(err)
		}
	}
}

// TestHandshakeRefusals covers every refused access of the handshake, in
// the order it checks: tag, state, tenant, request.
func TestHandshakeRefusals(t *testing.T) {
	p := newTestPool(t, 4)
	tag := sealed(t, p, alice, 4, 0xAA)
	stale := tag
	stale.Generation--
	otherNode := tag
	otherNode.Incarnation++
	pastEnd := tag
	pastEnd.Index = 4

	var staleErr *StaleTagError
	var tenantErr *WrongTenantError
	var ownerErr *WrongOwnerError
	for _, tc := range []struct {
		name  string
		tag   Tag
		owner Owner
		as    any
	}{
		{"stale generation", stale, alice, &staleErr},
		{"other incarnation", otherNode, alice, &staleErr},
		{"index past end", pastEnd, alice, &staleErr},
		{"other tenant", tag, bob, &tenantErr},
		{"other request same tenant", tag, alice2, &ownerErr},
	} {
		_, err := p.Lease(tc.tag, tc.owner)
		if !errors.As(err, tc.as) || !errors.Is(err, ErrRefused) {
			t.Errorf("%s: lease got %v, want %T", tc.name, err, tc.as)
		}
		if err := p.Write(tc.tag, tc.owner, 0, rows(1, 1)); !errors.As(err, tc.as) {
			t.Errorf("%s: write got %v, want %T", tc.name, err, tc.as)
		}
		if _, err := p.Release(tc.tag, tc.owner, t0); !errors.As(err, tc.as) {
			t.Errorf("%s: release got %v, want %T", tc.name, err, tc.as)
		}
	}
	if tenantErr.Owner != "alice" || tenantErr.Have != "bob" || ownerErr.Owner != 1 || ownerErr.Have != 3 {
		t.Errorf("errors lack the numbers: %v / %v", tenantErr, ownerErr)
	}
	if staleErr.Want != (Tag{}) { // the last stale case was the index past the end
		t.Errorf("past-end tag reported a current tag %s", staleErr.Want)
	}
	r := p.Stats().Refused
	if r.Stale != 9 || r.WrongTenant != 3 || r.WrongOwner != 3 {
		t.Errorf("refusal counters %+v, want 9 stale, 3 tenant, 3 owner", r)
	}
	// Nothing refused changed the page.
	if info := p.Inspect(tag.Index); info.State != Sealed || info.Readers != 0 || info.Owner != alice {
		t.Errorf("page after refusals: %+v", info)
	}
}

func TestTransitions(t *testing.T) {
	p := newTestPool(t, 2)
	tags, _ := p.Reserve(alice, 0, 1, t0)
	tag := tags[0]
	stateErr := func(err error, op string, s State) {
		t.Helper()
		var se *StateError
		if !errors.As(err, &se) || se.State != s {
			t.Fatalf("%s: got %v, want StateError in %s", op, err, s)
		}
	}
	// reserved: no seal, no lease, no ack.
	_, err := p.Seal(tag, alice)
	stateErr(err, "seal reserved", Reserved)
	_, err = p.Lease(tag, alice)
	stateErr(err, "lease reserved", Reserved)
	stateErr(p.AwaitAck(tag, alice), "await reserved", Reserved)

	// filling: writes must be contiguous and fit.
	if err := p.Write(tag, alice, 0, rows(2, 1)); err != nil {
		t.Fatal(err)
	}
	var re *TokenRangeError
	if err := p.Write(tag, alice, 3, rows(1, 2)); !errors.As(err, &re) || re.Filled != 2 || re.First != 3 {
		t.Fatalf("gap write: got %v", err)
	}
	if err := p.Write(tag, alice, 0, rows(1, 2)); !errors.As(err, &re) {
		t.Fatalf("overwrite: got %v", err)
	}
	if err := p.Write(tag, alice, 2, rows(3, 2)); !errors.As(err, &re) || re.Count != 3 || re.PageTokens != 4 {
		t.Fatalf("overflow write: got %v", err)
	}
	if err := p.Write(tag, alice, 2, []byte{1, 2, 3}); !errors.As(err, &re) || re.Count != -1 {
		t.Fatalf("partial-token write: got %v", err)
	}
	_, err = p.Lease(tag, alice)
	stateErr(err, "lease filling", Filling)
	if err := p.Write(tag, alice, 2, rows(1, 3)); err != nil {
		t.Fatal(err)
	}
	sum, err := p.Seal(tag, alice)
	if err != nil {
		t.Fatal(err)
	}
	if want := PageChecksum(tag, alice, 0, 3, append(rows(2, 1), rows(1, 3)...)); sum != want {
		t.Fatalf("seal sum %x, want %x", sum, want)
	}

	// sealed: immutable.
	stateErr(p.Write(tag, alice, 3, rows(1, 4)), "write sealed", Sealed)
	_, err = p.Seal(tag, alice)
	stateErr(err, "reseal", Sealed)
	_, _, err = p.Read(Lease{Tag: tag, Owner: alice})
	stateErr(err, "read without lease", Sealed)
	stateErr(p.Unlease(Lease{Tag: tag, Owner: alice}), "unlease without lease", Sealed)

	// leased: read through the lease only.
	l, err := p.Lease(tag, alice)
	if err != nil {
		t.Fatal(err)
	}
	b, n, err := p.Read(l)
	if err != nil || n != 3 || !bytes.Equal(b, append(rows(2, 1), rows(1, 3)...)) {
		t.Fatalf("read: %d tokens, err %v", n, err)
	}
	if s := p.Stats(); s.Leased != 1 || s.Sealed != 0 {
		t.Fatalf("stats while leased: %+v", s)
	}

	// release while leased is deferred; no new lease on a released page.
	freed, err := p.Release(tag, alice, t0)
	if err != nil || freed {
		t.Fatalf("release while leased: freed %t, err %v", freed, err)
	}
	_, err = p.Lease(tag, alice)
	stateErr(err, "lease released", Released)
	_, err = p.Release(tag, alice, t0)
	stateErr(err, "double release", Released)
	if _, _, err := p.Read(l); err != nil {
		t.Fatalf("read through a lease held across release: %v", err)
	}
	if err := p.Unlease(l); err != nil {
		t.Fatal(err)
	}
	// The last unlease freed the page and moved the generation on.
	if _, _, err := p.Read(l); !errors.Is(err, ErrRefused) {
		t.Fatalf("read after free: %v", err)
	}
	if info := p.Inspect(tag.Index); info.State != Free || info.Tag.Generation != tag.Generation+1 {
		t.Fatalf("after last unlease: %+v", info)
	}
	if s := p.Stats(); s.Free != 2 || s.Released != 0 || s.Leased != 0 {
		t.Fatalf("stats after free: %+v", s)
	}
}

func TestDeferredReleaseAwaitsAck(t *testing.T) {
	p := newTestPool(t, 1)
	tag := sealed(t, p, alice, 4, 7)
	if err := p.AwaitAck(tag, alice); err != nil {
		t.Fatal(err)
	}
	if err := p.AwaitAck(tag, alice); err == nil {
		t.Fatal("second AwaitAck accepted")
	}
	if freed, err := p.Release(tag, alice, t0); err != nil || freed {
		t.Fatalf("release awaiting ack: freed %t, err %v", freed, err)
	}
	if _, err := p.Reserve(bob, 0, 1, t0); err == nil {
		t.Fatal("a page awaiting ack was reallocated")
	}
	if got := p.Tick(t0.Add(29 * time.Second)); len(got) != 0 {
		t.Fatalf("reclaimed before the deadline: %+v", got)
	}
	if err := p.Ack(tag, alice); err != nil {
		t.Fatal(err)
	}
	if err := p.Ack(tag, alice); !errors.Is(err, ErrRefused) {
		t.Fatalf("ack after free: %v", err)
	}
	if s := p.Stats(); s.Free != 1 || s.Reclaimed.Total() != 0 {
		t.Fatalf("after ack: %+v", s)
	}
}

func TestReclaimDeadline(t *testing.T) {
	p := newTestPool(t, 2)
	tag := sealed(t, p, alice, 4, 7)
	l, _ := p.Lease(tag, alice)
	if err := p.AwaitAck(tag, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(tag, alice, t0); err != nil {
		t.Fatal(err)
	}
	if got := p.Tick(t0.Add(30*time.Second - 1)); len(got) != 0 {
		t.Fatalf("reclaimed early: %+v", got)
	}
	got := p.Tick(t0.Add(30 * time.Second))
	if len(got) != 1 || got[0].Tag != tag || got[0].Readers != 1 || !got[0].AwaitAck || got[0].Owner != alice {
		t.Fatalf("reclaim: %+v", got)
	}
	// Every late arrival presenting the old tag is refused.
	if _, _, err := p.Read(l); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("read through reclaimed lease: %v", err)
	}
	if err := p.Ack(tag, alice); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("late ack: %v", err)
	}
	if err := p.Write(tag, alice, 0, rows(1, 1)); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("late write: %v", err)
	}
	// The page is reusable, under a new tag.
	tags, err := p.Reserve(bob, 0, 2, t0)
	if err != nil || (tags[0] == tag || tags[1] == tag) {
		t.Fatalf("reserve after reclaim: %v %v", tags, err)
	}
	if s := p.Stats(); s.Reclaimed[Released] != 1 || s.Reclaimed.Total() != 1 || s.Reserved != 2 {
		t.Fatalf("stats: %+v", s)
	}
	if got := p.Tick(t0.Add(time.Minute)); len(got) != 0 {
		t.Fatalf("second tick reclaimed %+v", got)
	}
}

// TestOwnedPagesReclaimedAtDeadline: an owner that dies holding pages in
// any owned state (reserved, filling, sealed, leased) does not pin them
// past OwnedTimeout; each is reclaimed, counted by its state, and every
// late access of the dead owner presents a stale tag.
func TestOwnedPagesReclaimedAtDeadline(t *testing.T) {
	p := newTestPool(t, 4)
	owned := p.Config().OwnedTimeout
	tags, err := p.Reserve(alice, 0, 4, t0)
	if err != nil {
		t.Fatal(err)
	}
	// tags[0] stays reserved; tags[1] filling; tags[2] sealed; tags[3] leased.
	for i, tag := range tags[1:] {
		if err := p.Write(tag, alice, (i+1)*testGeom.PageTokens, rows(1, 9)); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range tags[2:] {
		if _, err := p.Seal(tag, alice); err != nil {
			t.Fatal(err)
		}
	}
	l, err := p.Lease(tags[3], alice)
	if err != nil {
		t.Fatal(err)
	}
	if info := p.Inspect(tags[0].Index); !info.Deadline.Equal(t0.Add(owned)) {
		t.Fatalf("deadline of a reserved page: %s, want %s", info.Deadline, t0.Add(owned))
	}
	if got := p.Tick(t0.Add(owned - 1)); len(got) != 0 {
		t.Fatalf("owned pages reclaimed before OwnedTimeout: %+v", got)
	}
	got := p.Tick(t0.Add(owned))
	states := map[Tag]State{}
	for _, r := range got {
		states[r.Tag] = r.State
	}
	want := map[Tag]State{tags[0]: Reserved, tags[1]: Filling, tags[2]: Sealed, tags[3]: Leased}
	if len(got) != 4 || fmt.Sprint(states) != fmt.Sprint(want) {
		t.Fatalf("reclaimed %+v, want %v", got, want)
	}
	s := p.Stats()
	if s.Free != 4 || s.Reclaimed[Reserved] != 1 || s.Reclaimed[Filling] != 1 || s.Reclaimed[Sealed] != 1 ||
		s.Reclaimed[Leased] != 1 || s.Reclaimed.Total() != 4 {
		t.Fatalf("stats after reclaiming owned pages: %+v", s)
	}
	if _, _, err := p.Read(l); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("read through a lease of a reclaimed owner: %v", err)
	}
	if err := p.Write(tags[1], alice, testGeom.PageTokens+1, rows(1, 9)); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("late write of a reclaimed owner: %v", err)
	}
	if _, err := p.Release(tags[0], alice, t0.Add(owned)); !errors.As(err, new(*StaleTagError)) {
		t.Fatalf("late release of a reclaimed owner: %v", err)
	}
	// A release moves the deadline to ReclaimAfter from then, sooner or
	// later than the owned one.
	tag := sealed(t, p, bob, 1, 3)
	l, _ = p.Lease(tag, bob)
	if _, err := p.Release(tag, bob, t0.Add(owned-time.Second)); err != nil {
		t.Fatal(err)
	}
	if info := p.Inspect(tag.Index); !info.Deadline.Equal(t0.Add(owned - time.Second + p.Config().ReclaimAfter)) {
		t.Fatalf("deadline after release: %s", info.Deadline)
	}
	if err := p.Unlease(l); err != nil {
		t.Fatal(err)
	}
}

// TestSealFromSource: a received page seals only if its bytes hash, under
// the source page's header, to the checksum the source sealed them with;
// bytes changed between the source's seal and the send are refused, and
// the page stays unsealed.
func TestSealFromSource(t *testing.T) {
	src, dst := newTestPool(t, 1), newTestPool(t, 2)
	srcTag := sealed(t, src, alice2, 3, 5)
	srcSum := src.Inspect(srcTag.Index).Checksum
	origin := Origin{Tag: srcTag, Owner: alice2, Checksum: srcSum}
	tags, err := dst.Reserve(alice, 0, 2, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := dst.Write(tags[0], alice, 0, rows(3, 5)); err != nil {
		t.Fatal(err)
	}
	sum, err := dst.SealFrom(tags[0], alice, origin)
	if err != nil || sum != PageChecksum(tags[0], alice, 0, 3, rows(3, 5)) {
		t.Fatalf("seal of the source's bytes: %x, %v", sum, err)
	}
	corrupt := rows(3, 5)
	corrupt[7] ^= 1
	if err := dst.Write(tags[1], alice, testGeom.PageTokens, corrupt); err != nil {
		t.Fatal(err)
	}
	// Changed bytes fail under the source's header, and under any other.
	for _, o := range []Origin{origin, {Tag: srcTag, Owner: bob, Checksum: srcSum}} {
		var mm *ChecksumMismatchError
		if _, err := dst.SealFrom(tags[1], alice, o); !errors.As(err, &mm) || mm.Want != srcSum {
			t.Fatalf("seal of changed bytes from %+v: %v", o, err)
		}
	}
	if s := dst.Stats(); s.Filling != 1 || s.Sealed != 1 || s.Refused.Checksum != 2 {
		t.Fatalf("after refused seals: %+v", s)
	}
}

func TestStaleBytesNeverVisible(t *testing.T) {
	// The incident: a new tenancy of a page must not expose what the
	// previous tenant left there, even though the arena is not cleared.
	p := newTestPool(t, 1)
	old := sealed(t, p, alice, 4, 0xAA)
	if _, err := p.Release(old, alice, t0); err != nil {
		t.Fatal(err)
	}
	tag := sealed(t, p, bob, 1, 0xBB)
	l, err := p.Lease(tag, bob)
	if err != nil {
		t.Fatal(err)
	}
	b, n, _ := p.Read(l)
	if n != 1 || bytes.IndexByte(b, 0xAA) >= 0 {
		t.Fatalf("new tenancy read %d tokens including the old tenant's bytes", n)
	}
}

func TestManifestVerify(t *testing.T) {
	p := newTestPool(t, 8)
	const tokens = 10 // pages of 4, 4, 2
	m, tags := sealedManifest(t, p, tokens)
	if err := m.Verify(p); err != nil {
		t.Fatal(err)
	}
	bobTag := sealed(t, p, bob, 4, 0xBB)

	for _, tc := range []struct {
		name string
		mut  func(m *Manifest)
		as   any
	}{
		{"tokens off", func(m *Manifest) { m.Tokens = 9 }, new(*ManifestError)},
		{"page missing", func(m *Manifest) { m.Pages = m.Pages[:2] }, new(*ManifestError)},
		{"page tokens off", func(m *Manifest) { m.Pages[2].Tokens = 3; m.Pages[1].Tokens = 3 }, new(*ManifestError)},
		{"checksum off", func(m *Manifest) { m.Pages[1].Checksum++ }, new(*ChecksumMismatchError)},
		{"stale tag", func(m *Manifest) { m.Pages[0].Tag.Generation++ }, new(*StaleTagError)},
		{"other tenant's page", func(m *Manifest) { m.Pages[0].Tag = bobTag }, new(*WrongTenantError)},
		{"swapped pages", func(m *Manifest) { m.Pages[0], m.Pages[1] = m.Pages[1], m.Pages[0] }, new(*ManifestError)},
		{"other owner", func(m *Manifest) { m.Owner = alice2 }, new(*WrongOwnerError)},
	} {
		c := *m
		c.Pages = append([]ManifestPage(nil), m.Pages...)
		tc.mut(&c)
		if err := c.Verify(p); !errors.As(err, tc.as) {
			t.Errorf("%s: got %v, want %T", tc.name, err, tc.as)
		}
	}
	// Corruption at rest: flip one byte in the arena behind the pool's back.
	p.bytesOf(tags[2].Index)[5] ^= 1
	var cm *ChecksumMismatchError
	if err := m.Verify(p); !errors.As(err, &cm) || cm.Want == cm.Have {
		t.Fatalf("corrupted page: got %v", err)
	}
	if _, err := NewManifest(alice, 10, 4, tags[:2]); err == nil {
		t.Fatal("manifest of 10 tokens over 2 pages of 4 accepted")
	}
}

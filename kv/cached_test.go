package kv

import (
	"bytes"
	"errors"
	"reflect"
	"strings"
	"testing"
)

var aliceScope = TenantScope("alice")

// published publishes a full page of alice's, of rows of fill, under
// scope.
func published(t *testing.T, p *Pool, scope Scope, fill byte) CachedPage {
	t.Helper()
	c, err := p.Publish(sealed(t, p, alice, testGeom.PageTokens, fill), alice, scope)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestPublishRefusals(t *testing.T) {
	for _, tc := range []struct {
		name  string
		page  func(p *Pool) Tag // makes the page and returns the tag presented
		owner Owner
		scope Scope
		want  error
	}{
		{"not full", func(p *Pool) Tag { return sealed(t, p, alice, testGeom.PageTokens-1, 1) }, alice, aliceScope, &TokenRangeError{}},
		{"reserved", func(p *Pool) Tag {
			tags, _ := p.Reserve(alice, 0, 1, t0)
			return tags[0]
		}, alice, aliceScope, &StateError{}},
		{"filling", func(p *Pool) Tag {
			tags, _ := p.Reserve(alice, 0, 1, t0)
			_ = p.Write(tags[0], alice, 0, rows(testGeom.PageTokens, 1))
			return tags[0]
		}, alice, aliceScope, &StateError{}},
		{"awaiting ack", func(p *Pool) Tag {
			tag := sealed(t, p, alice, testGeom.PageTokens, 1)
			_ = p.AwaitAck(tag, alice)
			return tag
		}, alice, aliceScope, &StateError{}},
		{"leased privately", func(p *Pool) Tag {
			tag := sealed(t, p, alice, testGeom.PageTokens, 1)
			_, _ = p.Lease(tag, alice)
			return tag
		}, alice, aliceScope, &StateError{}},
		{"another tenant", func(p *Pool) Tag { return sealed(t, p, alice, testGeom.PageTokens, 1) }, bob, TenantScope("bob"), &WrongTenantError{}},
		{"another request", func(p *Pool) Tag { return sealed(t, p, alice, testGeom.PageTokens, 1) }, alice2, aliceScope, &WrongOwnerError{}},
		{"a stale tag", func(p *Pool) Tag {
			tag := sealed(t, p, alice, testGeom.PageTokens, 1)
			_, _ = p.Release(tag, alice, t0)
			_ = sealed(t, p, alice, testGeom.PageTokens, 1)
			return tag
		}, alice, aliceScope, &StaleTagError{}},
		{"published already", func(p *Pool) Tag { return published(t, p, aliceScope, 1).Tag }, alice, aliceScope, &StateError{}},
		{"the zero scope", func(p *Pool) Tag { return sealed(t, p, alice, testGeom.PageTokens, 1) }, alice, Scope{}, nil},
	} {
		p := newTestPool(t, 1)
		tag := tc.page(p)
		before := p.Inspect(0)
		c, err := p.Publish(tag, tc.owner, tc.scope)
		if err == nil || (tc.want != nil && reflect.TypeOf(err) != reflect.TypeOf(tc.want)) || (tc.want == nil && errors.Is(err, ErrRefused)) {
			t.Fatalf("%s: publish gave %+v, %v; want a %T", tc.name, c, err, tc.want)
		}
		if after := p.Inspect(0); after != before {
			t.Fatalf("%s: a refused publish changed the page from %+v to %+v", tc.name, before, after)
		}
	}
}

// TestPublishRefusesBytesChangedSinceTheSeal: a page whose bytes changed
// at rest after its seal (decode refuses such a transfer and aborts it,
// and the abort would keep the pages) is not sealed again as a cached
// page: Publish refuses it, and AckPublish frees it as Ack would.
func TestPublishRefusesBytesChangedSinceTheSeal(t *testing.T) {
	p := newTestPool(t, 1)
	tag := sealed(t, p, alice, testGeom.PageTokens, 1)
	p.bytesOf(tag.Index)[0] ^= 0x40
	var mismatch *ChecksumMismatchError
	if c, err := p.Publish(tag, alice, aliceScope); !errors.As(err, &mismatch) {
		t.Fatalf("publish of a page flipped after its seal: %+v, %v", c, err)
	}
	if err := p.AwaitAck(tag, alice); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(tag, alice, t0); err != nil {
		t.Fatal(err)
	}
	c, err := p.AckPublish(tag, alice, aliceScope)
	if err != nil || c != (CachedPage{}) {
		t.Fatalf("ack-publish of a page flipped after its seal: %+v, %v; want it acknowledged, not kept", c, err)
	}
	if s := p.Stats(); s.Free != 1 || s.Cached != 0 {
		t.Fatalf("after the ack: %+v, want the page free", s)
	}
}

// TestCachedPageRefusesPrivateOps: nothing that takes a tag and an owner
// reaches a cached page, under its cached tag or the tag it was published
// from, whoever presents it; the page and its bytes are unchanged.
func TestCachedPageRefusesPrivateOps(t *testing.T) {
	p := newTestPool(t, 1)
	tag := sealed(t, p, alice, testGeom.PageTokens, 7)
	c, err := p.Publish(tag, alice, aliceScope)
	if err != nil {
		t.Fatal(err)
	}
	if c.Tag.Index != tag.Index || c.Tag.Generation != tag.Generation+1 || c.Scope != aliceScope || c.First != 0 ||
		c.Tokens != testGeom.PageTokens {
		t.Fatalf("published %s as %+v", tag, c)
	}
	before := p.Inspect(0)
	ops := map[string]func(Tag, Owner) error{
		"write": func(tag Tag, o Owner) error { return p.Write(tag, o, 0, rows(1, 9)) },
		"seal": func(tag Tag, o Owner) error {
			_, err := p.Seal(tag, o)
			return err
		},
		"seal from": func(tag Tag, o Owner) error {
			_, err := p.SealFrom(tag, o, Origin{Tag: tag, Owner: o, Checksum: c.Checksum})
			return err
		},
		"lease": func(tag Tag, o Owner) error {
			_, err := p.Lease(tag, o)
			return err
		},
		"release": func(tag Tag, o Owner) error {
			_, err := p.Release(tag, o, t0)
			return err
		},
		"await ack": func(tag Tag, o Owner) error { return p.AwaitAck(tag, o) },
		"ack":       func(tag Tag, o Owner) error { return p.Ack(tag, o) },
		"read": func(tag Tag, o Owner) error {
			_, _, err := p.Read(Lease{Tag: tag, Owner: o})
			return err
		},
		"unlease": func(tag Tag, o Owner) error { return p.Unlease(Lease{Tag: tag, Owner: o}) },
		"publish": func(tag Tag, o Owner) error {
			_, err := p.Publish(tag, o, aliceScope)
			return err
		},
	}
	for name, op := range ops {
		for _, o := range []Owner{alice, alice2, bob, cacheOwner(aliceScope)} {
			var state *StateError
			if err := op(c.Tag, o); !errors.As(err, &state) {
				t.Errorf("%s of the cached page by %s: %v, want a StateError", name, o, err)
			}
			var stale *StaleTagError
			if err := op(tag, o); !errors.As(err, &stale) {
				t.Errorf("%s under the tag it was published from, by %s: %v, want a StaleTagError", name, o, err)
			}
		}
	}
	if after := p.Inspect(0); after != before {
		t.Fatalf("refused ops changed the cached page from %+v to %+v", before, after)
	}
	l, err := p.LeaseShared(c, alice2, aliceScope)
	if err != nil {
		t.Fatal(err)
	}
	if b, n, err := p.Read(l); err != nil || n != testGeom.PageTokens || !bytes.Equal(b, rows(n, 7)) {
		t.Fatalf("read through a shared lease after the refusals: %d tokens, %v", n, err)
	}
}

// TestLeaseSharedRefusals: a shared lease needs the page's scope exactly,
// and its bytes as published; the refusal does not name the page's scope.
func TestLeaseSharedRefusals(t *testing.T) {
	p := newTestPool(t, 2)
	narrowed := aliceScope.Narrow("chat-1")
	c := published(t, p, narrowed, 3)
	for _, scope := range []Scope{aliceScope, aliceScope.Narrow("chat-2"), TenantScope("bob").Narrow("chat-1"),
		SharedScope("alice"), narrowed.Narrow("more")} {
		var wrong *WrongScopeError
		_, err := p.LeaseShared(c, alice, scope)
		if !errors.As(err, &wrong) || wrong.Page != c.Tag || wrong.Have != scope {
			t.Fatalf("a shared lease under %s of a page of %s: %v", scope, narrowed, err)
		}
		if strings.Contains(err.Error(), "chat-1") && !strings.Contains(scope.String(), "chat-1") {
			t.Fatalf("the refusal names the page's scope: %v", err)
		}
	}
	if s := p.Stats(); s.Refused.WrongTenant != 5 {
		t.Fatalf("refusals %+v, want the 5 counted as another tenant's", s.Refused)
	}
	if _, err := p.LeaseShared(c, Owner{Tenant: "alice"}, narrowed); err == nil || errors.Is(err, ErrRefused) {
		t.Fatalf("a shared lease for request 0: %v, want the owner refused as invalid", err)
	}

	forged := c
	forged.Checksum ^= 1
	var mismatch *ChecksumMismatchError
	if _, err := p.LeaseShared(forged, alice, narrowed); !errors.As(err, &mismatch) || mismatch.Want != forged.Checksum {
		t.Fatalf("a shared lease presenting another checksum: %v", err)
	}

	page := p.bytesOf(c.Tag.Index)
	page[len(page)-1] ^= 0x40 // a cache bug writes the cached page's last row
	if _, err := p.LeaseShared(c, alice, narrowed); !errors.As(err, &mismatch) || mismatch.Want != c.Checksum || mismatch.Have == c.Checksum {
		t.Fatalf("a shared lease of a tampered page: %v", err)
	}
	page[len(page)-1] ^= 0x40
	if _, err := p.LeaseShared(c, alice, narrowed); err != nil {
		t.Fatalf("a shared lease once the bytes are back: %v", err)
	}
}

// TestEvictWaitsForLastLease: a cached page evicted while leased stays
// readable through the leases held, takes no new one, and is freed by the
// last unlease, or by Tick at its reclaim deadline; its CachedPage and
// leases are stale from then on.
func TestEvictWaitsForLastLease(t *testing.T) {
	p := newTestPool(t, 1)
	c := published(t, p, aliceScope, 5)
	l1, err1 := p.LeaseShared(c, alice, aliceScope)
	l2, err2 := p.LeaseShared(c, alice2, aliceScope)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if freed, err := p.Evict(c, t0); freed || err != nil {
		t.Fatalf("evict with 2 leases held: freed %t, %v", freed, err)
	}
	if s := p.Stats(); s.Released != 1 || s.Cached != 0 {
		t.Fatalf("after evict: %+v", s)
	}
	var state *StateError
	if _, err := p.LeaseShared(c, alice, aliceScope); !errors.As(err, &state) {
		t.Fatalf("a new shared lease of an evicted page: %v", err)
	}
	if _, err := p.Evict(c, t0); !errors.As(err, &state) {
		t.Fatalf("a second evict: %v", err)
	}
	if b, _, err := p.Read(l1); err != nil || !bytes.Equal(b, rows(testGeom.PageTokens, 5)) {
		t.Fatalf("a read through a lease held on the evicted page: %v", err)
	}
	if err := p.Unlease(l1); err != nil || p.Stats().Free != 0 {
		t.Fatalf("the first unlease: %v, %+v", err, p.Stats())
	}
	if err := p.Unlease(l2); err != nil || p.Stats().Free != 1 {
		t.Fatalf("the last unlease: %v, %+v", err, p.Stats())
	}
	var stale *StaleTagError
	if _, err := p.LeaseShared(c, alice, aliceScope); !errors.As(err, &stale) {
		t.Fatalf("a shared lease of a freed page: %v", err)
	}
	if _, _, err := p.Read(l2); !errors.As(err, &stale) {
		t.Fatalf("a read through a lease of a freed page: %v", err)
	}

	c = published(t, p, aliceScope, 6)
	l, err := p.LeaseShared(c, alice, aliceScope)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Evict(c, t0); err != nil {
		t.Fatal(err)
	}
	if got := p.Tick(t0.Add(p.Config().ReclaimAfter)); len(got) != 1 || got[0].Tag != c.Tag || got[0].State != Released ||
		got[0].Readers != 1 {
		t.Fatalf("tick at the reclaim deadline: %+v", got)
	}
	if err := p.Unlease(l); !errors.As(err, &stale) {
		t.Fatalf("an unlease after the reclaim: %v", err)
	}
}

// TestLeaseSharedAdmitsOnlyTheScopesTenant: a reader presenting the very
// scope a page is cached under is still refused when the scope is another
// tenant's (narrowed or not): whatever computed the scope for the wrong
// tenant, the page does not grant it. A group's scope admits any tenant:
// its members are the policy's to say.
func TestLeaseSharedAdmitsOnlyTheScopesTenant(t *testing.T) {
	p := newTestPool(t, 3)
	bob := Owner{Request: 9, Tenant: "bob"}
	for _, scope := range []Scope{aliceScope, aliceScope.Narrow("chat-1")} {
		c := published(t, p, scope, 4)
		var wrong *WrongScopeError
		if _, err := p.LeaseShared(c, bob, scope); !errors.As(err, &wrong) {
			t.Fatalf("bob's shared lease under alice's scope %s: %v", scope, err)
		}
		if _, err := p.LeaseShared(c, Owner{Request: 9, Tenant: "alice"}, scope); err != nil {
			t.Fatalf("alice's shared lease under her scope %s: %v", scope, err)
		}
	}
	group := SharedScope("team")
	if _, err := p.LeaseShared(published(t, p, group, 5), bob, group); err != nil {
		t.Fatalf("bob's shared lease under a group's scope: %v", err)
	}
}

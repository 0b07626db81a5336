//go:build chaos

package kv

import (
	"bytes"
	"testing"
)

// readAs is a page read through l as a read that returned got would be
// counted: what Page.Read does with its own result, here with results a
// broken read could return.
func readAs(p *Pool, l Lease, got func(page []byte) []byte) {
	pg := &p.pages[l.Tag.Index]
	pg.rows.read(&pg.params.cross, pg.params.bpt, l.reader(), pg.bytes, got(pg.bytes))
}

// lease reserves the pool's one page for o, writes n rows and leases it.
func lease(t *testing.T, p *Pool, o Owner, n int) Lease {
	t.Helper()
	l, err := p.Lease(sealed(t, p, o, n, byte(o.Request)), o)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func release(t *testing.T, p *Pool, l Lease) {
	t.Helper()
	if err := p.Unlease(l); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Release(l.Tag, l.Owner, t0); err != nil {
		t.Fatal(err)
	}
}

// TestOracleQuietOnCorrectReads: tenancies of three owners follow each
// other on one page, each shorter than the last; every read returns only
// its own rows, and nothing is counted.
func TestOracleQuietOnCorrectReads(t *testing.T) {
	p := newTestPool(t, 1)
	for round := range 3 {
		for i, o := range []Owner{alice, bob, alice2} {
			l := lease(t, p, o, testGeom.PageTokens-i)
			b, n, err := p.Read(l)
			if err != nil || n != testGeom.PageTokens-i || !bytes.Equal(b, rows(n, byte(o.Request))) {
				t.Fatalf("round %d: %s read %d rows (%v)", round, o, n, err)
			}
			release(t, p, l)
		}
	}
	if c := p.Stats().Cross; c != (CrossRows{}) {
		t.Fatalf("cross reads %+v on correct reads", c)
	}
}

// TestOracleCatchesForeignRows: a read that returns the whole page (the
// bug the oracle is for) returns rows earlier tenancies wrote, and each
// is counted by whose they were; rows never written, rows not of the page
// and the reader's own rows are not.
func TestOracleCatchesForeignRows(t *testing.T) {
	p := newTestPool(t, 1)
	bpt := testGeom.BytesPerToken()
	whole := func(page []byte) []byte { return page }

	l := lease(t, p, alice, 2) // rows 0 and 1 are alice's; 2 and 3 never written
	readAs(p, l, whole)
	if c := p.Stats().Cross; c != (CrossRows{}) {
		t.Fatalf("alice's whole page: %+v, want nothing counted", c)
	}
	release(t, p, l)

	l = lease(t, p, bob, 1) // row 0 bob's, row 1 still alice's
	readAs(p, l, whole)
	if c := p.Stats().Cross; c != (CrossRows{Tenant: 1}) {
		t.Fatalf("bob's whole page: %+v, want alice's row 1 counted as another tenant's", c)
	}
	release(t, p, l)

	l = lease(t, p, alice2, 1) // row 0 alice2's, row 1 alice's: the same tenant, another request
	readAs(p, l, whole)
	readAs(p, l, func(page []byte) []byte { return page[bpt+1 : bpt+2] }) // inside row 1
	readAs(p, l, func(page []byte) []byte { return bytes.Clone(page) })   // not the page's bytes
	readAs(p, l, func(page []byte) []byte { return page[:bpt] })          // its own row
	readAs(p, l, func(page []byte) []byte { return page[2*bpt : 2*bpt] }) // nothing
	if c := p.Stats().Cross; c != (CrossRows{Tenant: 1, Request: 2}) {
		t.Fatalf("alice2's reads: %+v, want alice's row 1 counted twice as another request's", c)
	}
	if got := CrossRowsOf(p.pages); got != p.Stats().Cross {
		t.Fatalf("CrossRowsOf %+v, Stats %+v", got, p.Stats().Cross)
	}
}

// TestOracleCountsPerPool: pages of separate pools count apart.
func TestOracleCountsPerPool(t *testing.T) {
	a, b := newTestPool(t, 1), newTestPool(t, 1)
	release(t, a, lease(t, a, alice, 4))
	readAs(a, lease(t, a, bob, 1), func(page []byte) []byte { return page })
	if ca, cb := a.Stats().Cross, b.Stats().Cross; ca != (CrossRows{Tenant: 3}) || cb != (CrossRows{}) {
		t.Fatalf("pool a %+v, pool b %+v; want 3 rows in a only", ca, cb)
	}
}

// publish publishes a full page of o's under scope.
func publish(t *testing.T, p *Pool, o Owner, scope Scope, fill byte) CachedPage {
	t.Helper()
	tag := sealed(t, p, o, testGeom.PageTokens, fill)
	c, err := p.Publish(tag, o, scope)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestOracleQuietOnSharedReads: a cached page's rows are its scope's, so
// reads through shared leases of that scope count nothing, whichever
// request or tenant of the scope wrote them; a read under another scope
// (past the handshake, as a bug would let it) counts every row.
func TestOracleQuietOnSharedReads(t *testing.T) {
	p := newTestPool(t, 2)
	mine := publish(t, p, alice, TenantScope("alice"), 1)
	group := publish(t, p, alice, SharedScope("g"), 2)
	for _, r := range []struct {
		c      CachedPage
		reader Owner
		fill   byte
	}{{mine, alice2, 1}, {mine, alice, 1}, {group, bob, 2}, {group, alice2, 2}} {
		l, err := p.LeaseShared(r.c, r.reader, r.c.Scope)
		if err != nil {
			t.Fatal(err)
		}
		if b, _, err := p.Read(l); err != nil || !bytes.Equal(b, rows(testGeom.PageTokens, r.fill)) {
			t.Fatalf("%s read %s: %v", r.reader, r.c.Tag, err)
		}
	}
	if c := p.Stats().Cross; c != (CrossRows{}) {
		t.Fatalf("shared reads of the scope's own pages: %+v, want nothing counted", c)
	}
	readAs(p, Lease{Tag: mine.Tag, Owner: bob, Scope: TenantScope("bob")}, func(page []byte) []byte { return page })
	if c := p.Stats().Cross; c != (CrossRows{Tenant: uint64(testGeom.PageTokens)}) {
		t.Fatalf("a read of alice's cached page under bob's scope: %+v, want its %d rows counted", c, testGeom.PageTokens)
	}
}

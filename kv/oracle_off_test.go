//go:build !chaos

package kv

import (
	"testing"
	"unsafe"
)

// TestNoOracleInProduction: a production build keeps no writers and no
// counters, in no byte of a page or a pool, and counts nothing.
func TestNoOracleInProduction(t *testing.T) {
	if unsafe.Sizeof(rowWriters{}) != 0 || unsafe.Sizeof(crossCounters{}) != 0 {
		t.Fatal("the oracle takes memory in a production build")
	}
	// A zero-size field last in a struct would be padded.
	var pg Page
	if unsafe.Sizeof(pg) != unsafe.Offsetof(pg.deadline)+unsafe.Sizeof(pg.deadline) {
		t.Fatalf("a Page is %d bytes, its fields end at %d", unsafe.Sizeof(pg), unsafe.Offsetof(pg.deadline)+unsafe.Sizeof(pg.deadline))
	}
	p := newTestPool(t, 1)
	tag := sealed(t, p, alice, 4, 1)
	pg0 := &p.pages[tag.Index]
	pg0.rows.read(&pg0.params.cross, pg0.params.bpt, bob, pg0.bytes, pg0.bytes)
	if c := p.Stats().Cross; c != (CrossRows{}) {
		t.Fatalf("a production build counted %+v", c)
	}
}

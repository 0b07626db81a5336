package actors

import (
	"errors"
	"testing"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/kv"
)

// TestInvariantFailureStopsNotRestarts makes a page actor break an
// invariant (an assignment whose tag disagrees with the page: two owners in
// the making) and checks that the node reports it and that the actor was
// stopped, not restarted with fresh state.
func TestInvariantFailureStopsNotRestarts(t *testing.T) {
	n, err := Start(testConfig(), withModel(t, testConfig(), Options{}))
	if err != nil {
		t.Fatal(err)
	}
	defer n.Stop()
	pool := n.Pools()[0]
	bogus := kv.Tag{Incarnation: n.Config().Incarnation, Index: 0, Generation: 99}
	n.Root().Send(pool.Pages[0], pageAssign{Tag: bogus, Owner: kv.Owner{Request: 1, Tenant: "x"}})
	e := <-n.Fatal()
	if e.Message != "actors.pageAssign" || e.Actor != pool.Pages[0].String() {
		t.Fatalf("invariant error: %+v", e)
	}
	_, err = pool.Inspect(n.Root(), 0)
	if !errors.Is(err, ErrNoAnswer) || !errors.Is(err, actor.ErrDeadLetter) {
		t.Fatalf("page actor still answers after its invariant broke: %v", err)
	}
}

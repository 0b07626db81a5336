package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
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
	e := testwait.Recv(t, "the node's invariant error", time.Minute, n.Fatal())
	if e.Message != "actors.pageAssign" || e.Actor != pool.Pages[0].String() {
		t.Fatalf("invariant error: %+v", e)
	}
	// The actor stops as the supervisor's decision reaches it: an ask
	// that arrives while it stops can go unanswered (a timeout); once it
	// has stopped, every ask is a dead letter. One that restarted would
	// answer.
	waitFor(t, "asks to the page actor answered as dead letters", 30*time.Second, func() bool {
		_, err = pool.Inspect(n.Root(), 0)
		if err == nil {
			t.Fatal("page actor still answers after its invariant broke")
		}
		return errors.Is(err, ErrNoAnswer) && errors.Is(err, actor.ErrDeadLetter)
	})
}

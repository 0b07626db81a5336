package actors

import (
	"errors"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
)

// TestPageAskEndsWithoutAnAnswer: a page ask whose page does not answer
// ends as no answer (ErrNoAnswer, busy on the wire) at the pool's Timeout,
// and at once when the node stops, as a future's ask ends with a dead
// letter, rather than waiting out its Timeout on a page that is gone.
func TestPageAskEndsWithoutAnAnswer(t *testing.T) {
	cfg := testConfig()
	n := startNode(t, cfg)
	pool := nodePool(t, n, "silent/pool", 2, 50*time.Millisecond)
	// Page 0's actor takes every message and answers none.
	pool.Pages[0] = n.Root().Spawn(actor.PropsFromFunc(func(actor.Context) {}))
	tag := kv.Tag{Incarnation: n.Config().Incarnation, Index: 0, Generation: 1}
	rep := pool.Page(n.Root(), tag, PageRelease{Tag: tag})
	var na *NoAnswerError
	if !errors.As(rep.Err, &na) || !errors.Is(na.Cause, actor.ErrTimeout) || !errors.Is(rep.Err, ErrNoAnswer) {
		t.Fatalf("an ask its page does not answer: %v, want no answer within the pool's timeout", rep.Err)
	}

	pool.Timeout = time.Hour
	done := make(chan PageReply, 1)
	go func() { done <- pool.Page(n.Root(), tag, PageRelease{Tag: tag}) }()
	pool.stop()
	rep = testwait.Recv(t, "the ask's end once the node stops", time.Minute, done)
	if !errors.As(rep.Err, &na) || !errors.Is(na.Cause, actor.ErrDeadLetter) {
		t.Fatalf("an ask while the node stops: %v, want no answer (dead letter)", rep.Err)
	}
}

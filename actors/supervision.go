package actors

import (
	"fmt"
	"log/slog"

	"github.com/asynkron/protoactor-go/actor"
)

// InvariantError is what a node reports when an actor panicked: a broken
// invariant (two owners of a page, a generation going backwards, a free list
// over capacity). It is never restarted away.
type InvariantError struct {
	Actor   string
	Reason  any
	Message string // the message being handled, as %T
}

func (e *InvariantError) Error() string {
	return fmt.Sprintf("actors: invariant broken in %s while handling %s: %v", e.Actor, e.Message, e.Reason)
}

// stopOnPanic is the supervision of every kvwarden actor. protoactor's
// default restarts a panicking actor up to 10 times, rebuilding it from
// nothing while the pages it managed stay allocated: for a page or a pool
// that is a second owner in the making. Instead the failing actor is
// stopped, the failure is logged with its reason, and fatal decides for the
// node (the binary exits; a test fails).
type stopOnPanic struct {
	log   *slog.Logger
	fatal func(*InvariantError)
}

func (s *stopOnPanic) HandleFailure(_ *actor.ActorSystem, sup actor.Supervisor, child *actor.PID, _ *actor.RestartStatistics, reason, msg any) {
	err := &InvariantError{Actor: child.String(), Reason: reason, Message: fmt.Sprintf("%T", msg)}
	s.log.Error("actor failed; stopping it and the node", "actor", child.String(), "reason", fmt.Sprint(reason), "message", err.Message)
	sup.StopChildren(child)
	s.fatal(err)
}

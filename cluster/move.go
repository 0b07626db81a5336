package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// moveMargin is how much longer a move is waited for than its own
// deadline (the request's PrefillTimeout), which ends it first.
const moveMargin = 5 * time.Second

// MovesMaxLimit bounds NodeConfig.MovesMax.
const MovesMaxLimit = 64

// moveAway moves the requests in flight here, every one or that of
// number when it is not 0, to other decode nodes, MovesMax at once: each
// to the alive, verified, non-draining decode node of this model with the
// most free pages that takes it. No move begins past deadline, and none is
// waited for past it. It returns how many moved, how many stayed (a
// request that cannot move, that no node took, or that the deadline left
// where it is), and why one that stayed did.
func (n *Node) moveAway(number uint64, deadline time.Time) (moved, stayed int, why error) {
	if !n.cfg.Actors.Role.Decodes() {
		return 0, 0, nil
	}
	res, err := n.actors.Root().RequestFuture(n.actors.Admission(), actors.ListRequests{}, n.cfg.Actors.CallTimeout).Result()
	if err != nil {
		return 0, 0, fmt.Errorf("cluster: listing the requests to move: %w", err)
	}
	list, ok := res.(*messages.InFlightList)
	if !ok {
		return 0, 0, fmt.Errorf("cluster: listing the requests to move: admission answered %T", res)
	}
	found := false
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, n.cfg.MovesMax)
	for _, r := range list.Requests {
		if number != 0 && r.Number != number {
			continue
		}
		found = true
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			err := n.moveOne(r.Number, deadline)
			mu.Lock()
			defer mu.Unlock()
			var ended *actors.NotInFlightError
			switch {
			case err == nil:
				moved++
			case errors.As(err, &ended) && number == 0:
				// It ended meanwhile: nothing is left to move.
			default:
				stayed, why = stayed+1, err
			}
		})
	}
	wg.Wait()
	if number != 0 && !found {
		return 0, 1, &actors.NotInFlightError{Number: number, Incarnation: n.Incarnation(), Self: n.Incarnation()}
	}
	return moved, stayed, why
}

// moveOne moves request number to the first decode node that takes it,
// most free pages first, before deadline; a request that cannot move is
// not offered to another.
func (n *Node) moveOne(number uint64, deadline time.Time) error {
	self := n.Incarnation()
	err := error(&messages.WireError{Code: messages.CodeUnavailable, Where: "decode",
		Message: "no other decode node alive, verified, not draining and serving this model is in sight"})
	for _, m := range candidates(n.Members(), decodes, n.actors.Model().Fingerprint()) {
		if m.Meta.Incarnation == self {
			continue
		}
		left := time.Until(deadline)
		if left <= 0 {
			return &handoff.MoveRefusedError{Why: "the drain's time is up"}
		}
		err = n.actors.Move(number, handoff.Peer{Address: m.Meta.RemoteAddr, Incarnation: m.Meta.Incarnation},
			min(n.cfg.Actors.PrefillTimeout+moveMargin, left))
		var refused *handoff.MoveRefusedError
		var ended *actors.NotInFlightError
		if err == nil || errors.As(err, &refused) || errors.As(err, &ended) {
			return err
		}
		n.log.Info("move not taken", "number", number, "to", m.Name, "err", err)
	}
	return err
}

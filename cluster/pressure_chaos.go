//go:build chaos

package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// Pool pressure (messages.PressureRequest): the node reserves pages of
// each of its pools through the pools' own reservations, as an owner of
// its own, and releases them when the hold is over. Admission and routing
// meanwhile meet pools that many pages smaller, as they would next to a
// heavy tenant.

// pressureTenant names the tenant of the owner of each hold, followed by
// the hold's number: each hold is a tenant of its own, as a heavy tenant
// next to others, which the pools' shares among tenants (tenancy.
// PoolShares) let take what is free. It has a space, which no tenant that
// crosses the wire may have (messages takes only visible ASCII), so no
// request can ever present it.
const pressureTenant = "pool pressure"

// pressureHoldsMax bounds the holds a node keeps at once.
const pressureHoldsMax = 16

// pressureReserveTries bounds the reservations one pool is asked for: a
// pool that had fewer free pages than asked is asked again for those it
// said it had, which others may take meanwhile.
const pressureReserveTries = 4

// pressureHolds are the holds of one node: a timer each, which releases
// its pages.
type pressureHolds struct {
	mu     sync.Mutex
	timers map[uint64]*time.Timer // by the holding owner's request id
	ids    uint64                 // holds started, for owner request ids
	closed bool
	wg     sync.WaitGroup // releases under way
}

// hold is one hold's pages, pool by pool.
type hold struct {
	owner kv.Owner
	pools []*actors.Pool
	tags  [][]kv.Tag
}

// pressure holds up to m.Pages pages of each of the node's pools for
// m.DurationMs.
func (n *Node) pressure(m *messages.PressureRequest) *messages.PressureReply {
	d := time.Duration(m.DurationMs) * time.Millisecond
	if owned := n.cfg.Actors.OwnedPageTimeout; d >= owned {
		return pressureRefused(messages.CodeBadRequest, fmt.Sprintf(
			"a hold of %s: pages owned for %s are reclaimed, so a hold must be shorter", d, owned),
			uint64(m.DurationMs), uint64(owned.Milliseconds()))
	}
	owner, ok := n.held.start()
	if !ok {
		return pressureRefused(messages.CodeBusy, "the node keeps as many holds at once as it may", pressureHoldsMax, pressureHoldsMax)
	}
	h := &hold{owner: owner, pools: n.actors.Pools()}
	rep := &messages.PressureReply{}
	for _, p := range h.pools {
		tags := n.reserveUpTo(p, owner, int(m.Pages))
		h.tags = append(h.tags, tags)
		rep.Held = append(rep.Held, messages.PoolHeld{Name: p.PID.Id, Pages: uint32(len(tags))})
	}
	n.log.Warn("pool pressure: holding pages", "for", d, "owner", owner.Request, "held", fmt.Sprint(rep.Held))
	n.held.arm(owner.Request, d, func() { n.release(h) })
	return rep
}

func pressureRefused(code messages.ErrorCode, msg string, have, limit uint64) *messages.PressureReply {
	return &messages.PressureReply{Err: &messages.WireError{Code: code, Message: msg, Have: have, Limit: limit, Where: "pool pressure"}}
}

// reserveUpTo reserves want pages of p for owner, or as many as p has
// free: fewer, or none, when others take them meanwhile.
func (n *Node) reserveUpTo(p *actors.Pool, owner kv.Owner, want int) []kv.Tag {
	for range pressureReserveTries {
		tags, err := p.Reserve(n.actors.Root(), owner, 0, want)
		var ex *kv.PoolExhaustedError
		switch {
		case err == nil:
			return tags
		case errors.As(err, &ex) && ex.Free > 0:
			want = min(want, ex.Free)
		default:
			if !errors.As(err, &ex) {
				n.log.Warn("pool pressure: reserve", "pool", p.PID.Id, "err", err)
			}
			return nil
		}
	}
	return nil
}

// release gives a hold's pages back.
func (n *Node) release(h *hold) {
	for i, p := range h.pools {
		for _, t := range h.tags[i] {
			if err := p.Page(n.actors.Root(), t, actors.PageRelease{Tag: t, Owner: h.owner}).Err; err != nil {
				n.log.Warn("pool pressure: release", "pool", p.PID.Id, "tag", t.String(), "err", err)
			}
		}
	}
	n.log.Info("pool pressure: released", "owner", h.owner.Request)
}

// start takes a place for a hold and names its owner; false when
// pressureHoldsMax holds are on, or the node is stopping.
func (hs *pressureHolds) start() (kv.Owner, bool) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	if hs.closed || len(hs.timers) >= pressureHoldsMax {
		return kv.Owner{}, false
	}
	if hs.timers == nil {
		hs.timers = map[uint64]*time.Timer{}
	}
	hs.ids++
	id := hs.ids
	hs.timers[id] = nil // the place, until arm
	return kv.Owner{Request: id, Tenant: fmt.Sprint(pressureTenant, " ", id)}, true
}

// arm releases hold id after d, unless the node stops first.
func (hs *pressureHolds) arm(id uint64, d time.Duration, release func()) {
	hs.mu.Lock()
	defer hs.mu.Unlock()
	hs.timers[id] = time.AfterFunc(d, func() {
		hs.mu.Lock()
		if hs.closed {
			hs.mu.Unlock()
			return
		}
		delete(hs.timers, id)
		hs.wg.Add(1)
		hs.mu.Unlock()
		defer hs.wg.Done()
		release()
	})
}

// stop releases nothing more, and waits for the releases under way: the
// node is going down with its pools.
func (hs *pressureHolds) stop() {
	hs.mu.Lock()
	hs.closed = true
	for _, t := range hs.timers {
		if t != nil {
			t.Stop()
		}
	}
	hs.mu.Unlock()
	hs.wg.Wait()
}

package cluster

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// results are the results r has received, in order.
func (r *received) results() []*messages.GenerateResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*messages.GenerateResult
	for _, m := range r.all {
		if res, ok := m.(*messages.GenerateResult); ok {
			out = append(out, res)
		}
	}
	return out
}

// TestRouterBoundsItsRelays: a router refuses, by its own bounds and
// before anything reaches a decode node, a client's second request of an
// id it has in flight (bad request) and a request past QueueMax relays in
// flight (busy, with both numbers); the requests within the bounds are
// routed. The decode node here holds every request it is sent, so the
// router's bounds are all that stands.
func TestRouterBoundsItsRelays(t *testing.T) {
	d0 := &fakeDecode{addr: "decode-0:1"}
	f := startFakeRoute(t, d0)
	queueMax := DefaultLocalNodeConfig(actors.RoleRouter).Actors.QueueMax // startFakeRoute's router's
	send := func(id uint64) {
		// Two tenants, each within its default share (tenancy.DefaultShare):
		// the router's own QueueMax is what refuses.
		f.sys.Root.RequestWithCustomSender(f.router, &messages.GenerateRequest{RequestID: id, Tenant: fmt.Sprint("tenant-", id%2),
			Prompt: "held", MaxTokens: 4}, f.client)
	}
	// refused waits for the router's answer to the one request of want
	// results (or for the decode node to hold more than held).
	refused := func(what string, want, held int) *messages.GenerateResult {
		t.Helper()
		testwait.Report(t, what+" answered or routed", time.Minute, func() (bool, string) {
			n, h := len(f.got.results()), d0.held()
			return n >= want || h > held, fmt.Sprintf("%d results, %d requests at the decode node", n, h)
		})
		if h := d0.held(); h != held {
			t.Fatalf("%s routed: the decode node holds %d requests, want %d", what, h, held)
		}
		return f.got.results()[want-1]
	}
	send(1)
	testwait.For(t, "request 1 at the decode node", time.Minute, func() bool { return d0.held() == 1 })
	send(1)
	dup := refused("request 1 again", 1, 1)
	if dup.RequestID != 1 || dup.Err == nil || dup.Err.Code != messages.CodeBadRequest ||
		!strings.Contains(dup.Err.Message, "request id 1 is already in flight") {
		t.Fatalf("request 1 again while in flight: %+v", dup.Err)
	}
	for id := uint64(2); id <= uint64(queueMax); id++ {
		send(id)
	}
	testwait.Report(t, "QueueMax requests at the decode node", time.Minute, func() (bool, string) {
		return d0.held() == queueMax, fmt.Sprintf("%d held", d0.held())
	})
	send(uint64(queueMax) + 1)
	busy := refused("a request past QueueMax", 2, queueMax)
	if e := busy.Err; busy.RequestID != uint64(queueMax)+1 || e == nil || e.Code != messages.CodeBusy || e.Where != "router" ||
		e.Have != uint64(queueMax) || e.Limit != uint64(queueMax) {
		t.Fatalf("request %d, %d relays in flight: %+v", queueMax+1, queueMax, e)
	}
	if r, busy, bad := f.counters.routed.Load(), f.counters.rejectedBusy.Load(), f.counters.rejectedBad.Load(); r != uint64(queueMax) ||
		busy != 1 || bad != 1 {
		t.Fatalf("router counted %d routed, %d busy, %d bad; want %d, 1, 1", r, busy, bad, queueMax)
	}
}

package cluster

import (
	"cmp"
	"fmt"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/gpu"
	"github.com/kvwarden/kvwarden/messages"
)

// routerCounters are read by status.
type routerCounters struct {
	routed, rejectedTooLong, rejectedBusy, rejectedBad, lost atomic.Uint64
}

// routed is a request a router sent to a decode node, until it is known
// over (or surely over, past the request timeout).
type routed struct {
	client     *actor.PID
	id         uint64
	decode     uint64 // incarnation
	decodeAddr string
	expires    time.Time
}

// routerActor admits client requests for a cluster: it refuses, before any
// page exists anywhere, a request that does not fit the context window or
// the smallest pool on the path it would take, and forwards the rest to
// the decode node with the most free pages (with the prefill node with the
// most free pages chosen for it), keeping the client as the sender so that
// tokens stream from the decode node straight to the client. A draining or
// suspect node gets no new work. When a decode node is lost, the router
// tells the clients of the requests it sent there.
type routerActor struct {
	cfg      *actors.Config
	members  func() []Member
	log      *slog.Logger
	counters *routerCounters
	requests map[string]routed // by client PID and id
}

// memberLost is sent to the router when a member fails or leaves.
type memberLost struct{ incarnation uint64 }

func routedKey(client *actor.PID, id uint64) string {
	return fmt.Sprintf("%s#%d", client, id)
}

func (r *routerActor) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *actor.Started:
		r.requests = map[string]routed{}
	case *messages.GenerateRequest:
		r.route(c, m)
	case *messages.CancelRequest:
		if rt, ok := r.requests[routedKey(c.Sender(), m.RequestID)]; ok {
			c.RequestWithCustomSender(actor.NewPID(rt.decodeAddr, actors.AdmissionName), m, c.Sender())
		}
	case memberLost:
		r.lost(c, m.incarnation)
	case *messages.Undecodable:
		r.counters.rejectedBad.Add(1)
	}
}

// candidates are the alive, non-draining members whose role does kind,
// most free pages first.
func candidates(ms []Member, kind func(Role) bool) []Member {
	var out []Member
	for _, m := range ms {
		if m.State == StateAlive && !m.Meta.Draining && kind(m.Meta.Role) {
			out = append(out, m)
		}
	}
	slices.SortStableFunc(out, func(a, b Member) int { return cmp.Compare(b.Meta.FreePages, a.Meta.FreePages) })
	return out
}

func prefills(r Role) bool { return r == RolePrefill || r == RoleAll }
func decodes(r Role) bool  { return r == RoleDecode || r == RoleAll }

func (r *routerActor) route(c actor.Context, m *messages.GenerateRequest) {
	reject := func(err error, counter *atomic.Uint64) {
		counter.Add(1)
		if err := actors.Reject(c, m.RequestID, err); err != nil {
			r.log.Error("rejection refused by its own validation", "err", err)
		}
	}
	ms := r.members()
	ds, ps := candidates(ms, decodes), candidates(ms, prefills)
	if len(ds) == 0 || len(ps) == 0 {
		reject(&actors.BusyError{Where: fmt.Sprintf("cluster (%d decode, %d prefill nodes available)", len(ds), len(ps))},
			&r.counters.rejectedBusy)
		return
	}
	d, p := ds[0], ps[0]
	prompt := len(gpu.ByteTokenizer{}.Encode(m.Prompt))
	if err := r.cfg.Check(prompt, int(m.MaxTokens), int(p.Meta.CapacityPages), int(d.Meta.CapacityPages)); err != nil {
		if _, ok := err.(*actors.PromptTooLongError); ok {
			reject(err, &r.counters.rejectedTooLong)
		} else {
			reject(err, &r.counters.rejectedBad)
		}
		return
	}
	now := time.Now()
	r.prune(now)
	fwd := &messages.RoutedRequest{RequestID: m.RequestID, Tenant: m.Tenant, Prompt: m.Prompt, MaxTokens: m.MaxTokens,
		Prefill: p.Meta.RemoteAddr, PrefillIncarnation: p.Meta.Incarnation}
	if err := fwd.Validate(); err != nil {
		reject(err, &r.counters.rejectedBad)
		return
	}
	c.RequestWithCustomSender(actor.NewPID(d.Meta.RemoteAddr, actors.AdmissionName), fwd, c.Sender())
	r.requests[routedKey(c.Sender(), m.RequestID)] = routed{client: c.Sender(), id: m.RequestID,
		decode: d.Meta.Incarnation, decodeAddr: d.Meta.RemoteAddr, expires: now.Add(r.cfg.RequestTimeout)}
	r.counters.routed.Add(1)
}

// lost answers the clients of every request sent to a decode node that
// is gone: the node cannot answer them any more.
func (r *routerActor) lost(c actor.Context, inc uint64) {
	for k, rt := range r.requests {
		if rt.decode != inc {
			continue
		}
		delete(r.requests, k)
		r.counters.lost.Add(1)
		res := &messages.GenerateResult{RequestID: rt.id, FinishReason: messages.FinishError,
			Err: &messages.WireError{Code: messages.CodeNodeLost, Message: fmt.Sprintf("decode node %x was lost", inc),
				Where: rt.decodeAddr}}
		if err := messages.Send(c, rt.client, res); err != nil {
			r.log.Error("node-lost result refused by its own validation", "err", err)
		}
	}
}

// prune forgets requests past their timeout: their decode node has
// answered them one way or another by now.
func (r *routerActor) prune(now time.Time) {
	for k, rt := range r.requests {
		if now.After(rt.expires) {
			delete(r.requests, k)
		}
	}
}

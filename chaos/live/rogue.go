package live

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// Bounds of a rogue round.
const (
	// rogueFrames is how many batches of forged frames a round sends to
	// its target's data plane, each on its own connection (the receiver
	// closes one that brought a refused batch).
	rogueFrames = 4
	// rogueAnswerTimeout bounds the wait for a forbidden answer.
	rogueAnswerTimeout = 5 * time.Second
	// rogueCountTimeout bounds the wait for the nodes' status to count
	// the round's refusals: a refused message without an answer is
	// counted when the node reads it, which the rogue cannot observe.
	rogueCountTimeout = 10 * time.Second
	// roguePoll is how often the rogue reads the counts meanwhile.
	roguePoll          = 100 * time.Millisecond
	streamRogue uint64 = 0x70617e0e
)

// Attack is one forgery of a rogue round and what became of it.
type Attack struct {
	Name string `json:"name"`
	Node string `json:"node"`
	// Want are the refusal kinds (trust.Refusal's names) the node may
	// count it under.
	Want []string `json:"want"`
	// Refused: the rogue saw it refused: the node answered forbidden,
	// refused the batch or the hello, or did nothing it was asked.
	Refused bool `json:"refused"`
	// Counted: the node's status counted it under Want.
	Counted bool `json:"counted"`
	// Skipped: it could not be made (the node did not answer its status,
	// the connection failed before the node could judge it).
	Skipped bool   `json:"skipped,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Failed says whether the attack was made and not both refused and
// counted.
func (a Attack) Failed() bool { return !a.Skipped && (!a.Refused || !a.Counted) }

// RoguePeer is a peer of the cluster gone bad. It holds two certificates of
// the cluster's CA, a tenant's and a prefill node's, and forges with
// them: frames for guessed requests and tenants into a decode node's data
// plane, a data-plane hello as a tenant, a routed request as a tenant, a
// request in another tenant's name, a transfer plan to a prefill node, a
// drain and a status request to every node, and a message whose sender
// claims another node's address. Request actors, relays and clients have
// secret names, so a forged result can reach no one who would take it:
// the frames are the results it can forge. Every forgery must be refused
// and counted, and change no answer.
type RoguePeer struct {
	tenant, peer *trust.Authority
	geometry     kv.Geometry
	tenants      []string
	incarnation  uint64
	// sys sends every forgery but the forged sender's, which forger
	// sends: the guard closes the stream that carried it, and refuses
	// the whole batch, so it must share neither with another forgery.
	sys, forger       *actor.ActorSystem
	remote, forgerRem *remote.Remote
}

// NewRogue starts the rogue's remote endpoint as tenant, on 127.0.0.1.
// peer is a prefill node's credentials, geometry the nodes' KV geometry,
// tenants the workload's tenants (whose requests it forges frames for).
func NewRogue(tenant, peer *trust.Authority, geometry kv.Geometry, tenants []string) (*RoguePeer, error) {
	if tenant.Self().Role != trust.RoleTenant || !peer.Self().Role.Prefills() {
		return nil, fmt.Errorf("live: a rogue needs a tenant's and a prefill node's credentials, not %s and %s",
			tenant.Self(), peer.Self())
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, err
	}
	rp := &RoguePeer{tenant: tenant, peer: peer, geometry: geometry, tenants: tenants,
		incarnation: binary.LittleEndian.Uint64(b[:]) | 1}
	var err error
	if rp.sys, rp.remote, err = rogueRemote(tenant); err != nil {
		return nil, err
	}
	if rp.forger, rp.forgerRem, err = rogueRemote(tenant); err != nil {
		rp.remote.Shutdown(false)
		rp.sys.Shutdown()
		return nil, err
	}
	return rp, nil
}

func rogueRemote(tenant *trust.Authority) (*actor.ActorSystem, *remote.Remote, error) {
	sys := messages.NewActorSystem(nil)
	r, err := messages.StartRemoteAwaiting(sys, "127.0.0.1:0", tenant)
	if err != nil {
		sys.Shutdown()
		return nil, nil, err
	}
	return sys, r, nil
}

// Close stops the rogue's endpoints.
func (r *RoguePeer) Close() {
	r.remote.Shutdown(false)
	r.sys.Shutdown()
	r.forgerRem.Shutdown(false)
	r.forger.Shutdown()
}

// roundTarget is what the round knows of a node.
type roundTarget struct {
	Node
	status *messages.StatusReply
}

// Round plays one round at the cluster, its frames at f.Target, and
// checks that every node counted what it refused.
func (r *RoguePeer) Round(ctx context.Context, c Cluster, f Fault) ([]Attack, error) {
	rnd := newRand(f.Seed, streamRogue)
	var nodes []roundTarget
	for _, n := range c.Nodes() {
		s, err := c.Status(n.Addr)
		if err == nil {
			nodes = append(nodes, roundTarget{Node: n, status: s})
		}
	}
	target, ok := find(nodes, func(n roundTarget) bool { return n.Name == f.Target })
	if !ok {
		return nil, fmt.Errorf("live: rogue: no status of %s", f.Target)
	}
	var as []Attack
	for range rogueFrames {
		as = append(as, r.frames(ctx, target, rnd))
	}
	as = append(as, r.hello(target), r.routed(target, nodes, rnd, nil))
	if router, ok := find(nodes, func(n roundTarget) bool { return n.Role == messages.RoleRouter }); ok {
		as = append(as, r.claim(router, rnd), r.send(router, "status request", &messages.StatusRequest{}))
	}
	if p, ok := find(nodes, func(n roundTarget) bool { return n.Role == messages.RolePrefill }); ok {
		as = append(as, r.plan(p, target, rnd))
	}
	for _, n := range nodes {
		as = append(as, r.send(n, "drain request", &messages.DrainRequest{}))
	}
	// Last: the guard closes the stream that carried it.
	if router, ok := find(nodes, func(n roundTarget) bool { return n.Role == messages.RoleRouter }); ok {
		as = append(as, r.routed(target, nodes, rnd, actor.NewPID(router.Addr, actors.AdmissionName)))
	}
	return as, r.count(ctx, c, nodes, as)
}

func find(ns []roundTarget, match func(roundTarget) bool) (roundTarget, bool) {
	if i := slices.IndexFunc(ns, match); i >= 0 {
		return ns[i], true
	}
	return roundTarget{}, false
}

func names(rs ...trust.Refusal) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.String()
	}
	return out
}

// dataPlane is the rogue's data-plane configuration as peer.
func (r *RoguePeer) dataPlane() dataplane.Config {
	cfg := dataplane.DefaultLocalConfig(r.geometry, r.incarnation)
	cfg.Auth = r.peer
	return cfg
}

func identityOf(s *messages.StatusReply) (trust.Identity, error) {
	u, err := url.Parse(s.Node.Identity)
	if err != nil {
		return trust.Identity{}, err
	}
	return trust.ParseIdentity(u)
}

// frames sends one batch of a forged frame, for a guessed request (near
// the node's admitted count) of a tenant of the workload, to a guessed
// page of the node.
func (r *RoguePeer) frames(ctx context.Context, n roundTarget, rnd *mrand.Rand) Attack {
	a := Attack{Name: "forged frames", Node: n.Name, Want: names(trust.RefusedStranger, trust.RefusedDataPlane)}
	s := n.status
	want, err := identityOf(s)
	if err != nil || s.Node.DataPlane == "" {
		a.Skipped, a.Detail = true, fmt.Sprintf("no data plane and identity in its status (%q, %v)", s.Node.DataPlane, err)
		return a
	}
	snd, err := dataplane.Dial(r.dataPlane(), s.Node.DataPlane, s.Node.Incarnation, want)
	if err != nil {
		a.Skipped, a.Detail = true, "dial: "+err.Error()
		return a
	}
	defer snd.Close()
	capacity := uint32(1)
	if len(s.Node.Pools) > 0 {
		capacity = max(s.Node.Pools[0].Capacity, 1)
	}
	id := max(s.Node.Admitted, 4) - 3 + rnd.Uint64N(5)
	tenant := r.tenants[rnd.IntN(len(r.tenants))]
	payload := make([]byte, r.geometry.PageTokens*r.geometry.BytesPerToken())
	for i := range payload {
		payload[i] = byte(rnd.Uint32())
	}
	fr := kv.Frame{Owner: kv.Owner{Request: id, Tenant: tenant},
		Source:     kv.Tag{Incarnation: r.incarnation, Index: rnd.Uint32N(1024), Generation: 1},
		Dest:       kv.Tag{Incarnation: s.Node.Incarnation, Index: rnd.Uint32N(capacity), Generation: 1 + rnd.Uint64N(1<<16)},
		FirstToken: 0, Tokens: r.geometry.PageTokens, Payload: payload}
	err = snd.Send(ctx, []kv.Frame{fr})
	a.Refused = err != nil
	a.Detail = fmt.Sprintf("request %d of %s to page %s: %v", id, tenant, fr.Dest, err)
	return a
}

// hello dials the node's data plane as a tenant.
func (r *RoguePeer) hello(n roundTarget) Attack {
	a := Attack{Name: "data-plane hello as a tenant", Node: n.Name, Want: names(trust.RefusedDataPlane)}
	s := n.status
	want, err := identityOf(s)
	if err != nil || s.Node.DataPlane == "" {
		a.Skipped, a.Detail = true, "no data plane and identity in its status"
		return a
	}
	cfg := r.dataPlane()
	cfg.Auth = r.tenant
	snd, err := dataplane.Dial(cfg, s.Node.DataPlane, s.Node.Incarnation, want)
	if err == nil {
		snd.Close()
		a.Detail = "the hello was accepted"
		return a
	}
	a.Refused = errors.Is(err, dataplane.ErrRefused)
	a.Detail = err.Error()
	if !a.Refused {
		a.Skipped = true
	}
	return a
}

// ask sends m and reads the error of the answer: what a forbidden answer
// carries.
func (r *RoguePeer) ask(to *actor.PID, m messages.Message) (*messages.WireError, error) {
	res, err := messages.Request(r.sys.Root, to, m, rogueAnswerTimeout)
	if err != nil {
		return nil, err
	}
	switch m := res.(type) {
	case *messages.GenerateResult:
		return m.Err, nil
	case *messages.TransferDone:
		return m.Err, nil
	}
	return nil, fmt.Errorf("live: rogue: answered %T", res)
}

// forbidden makes an attack of an answer that must be forbidden. No
// answer at all (it may be lost on a connection a fault broke) leaves the
// verdict to the node's count, since a node that took the forgery would
// not count a refusal.
func forbidden(a Attack, we *messages.WireError, err error) Attack {
	switch {
	case errors.Is(err, actor.ErrTimeout):
		a.Refused, a.Detail = true, "no answer within "+rogueAnswerTimeout.String()+": the count decides"
	case err != nil:
		a.Detail = err.Error()
	case we == nil:
		a.Detail = "answered without an error"
	default:
		a.Refused, a.Detail = we.Code == messages.CodeForbidden, we.Error()
	}
	return a
}

// routed sends the node a routed request as a tenant; with a sender, one
// that claims to come from that address.
func (r *RoguePeer) routed(n roundTarget, nodes []roundTarget, rnd *mrand.Rand, sender *actor.PID) Attack {
	m := &messages.RoutedRequest{RequestID: 1 + rnd.Uint64N(1<<62), Tenant: r.tenants[rnd.IntN(len(r.tenants))],
		Prompt: "rogue routed request", MaxTokens: 4, PrefillIncarnation: 1, DecodeIncarnation: n.Incarnation}
	m.Prefill = n.Addr
	if p, ok := find(nodes, func(n roundTarget) bool { return n.Role == messages.RolePrefill }); ok {
		m.Prefill, m.PrefillIncarnation = p.Addr, p.Incarnation
	}
	to := actor.NewPID(n.Addr, actors.AdmissionName)
	if sender != nil {
		// Whether it was refused only the node's count can tell: the
		// answer would go to the node the sender names.
		a := Attack{Name: "routed request from a forged sender at " + sender.Address, Node: n.Name,
			Want: names(trust.RefusedBatch), Refused: true}
		if err := m.Validate(); err != nil {
			a.Refused, a.Detail = false, err.Error()
			return a
		}
		r.forger.Root.RequestWithCustomSender(to, m, sender)
		return a
	}
	we, err := r.ask(to, m)
	return forbidden(Attack{Name: "routed request as a tenant", Node: n.Name, Want: names(trust.RefusedRole)}, we, err)
}

// claim asks the router to generate in another tenant's name.
func (r *RoguePeer) claim(n roundTarget, rnd *mrand.Rand) Attack {
	victim := r.tenants[rnd.IntN(len(r.tenants))]
	m := &messages.GenerateRequest{RequestID: 1 + rnd.Uint64N(1<<62), Tenant: victim, Prompt: "rogue asks as " + victim,
		MaxTokens: 4, Stream: true}
	we, err := r.ask(actor.NewPID(n.Addr, actors.AdmissionName), m)
	return forbidden(Attack{Name: "request in " + victim + "'s name", Node: n.Name, Want: names(trust.RefusedTenant)}, we, err)
}

// plan sends a prefill node a plan naming guessed pages of the target.
func (r *RoguePeer) plan(p, target roundTarget, rnd *mrand.Rand) Attack {
	tokens := []uint32{'r', 'o', 'g', 'u', 'e'}
	m := &messages.TransferPlan{RequestID: 1 + rnd.Uint64N(1<<62), Tenant: r.tenants[rnd.IntN(len(r.tenants))],
		TokenCount: uint32(len(tokens)), PromptTokens: tokens, PageTokens: uint32(r.geometry.PageTokens),
		DestTags:  []kv.Tag{{Incarnation: target.Incarnation, Index: rnd.Uint32N(64), Generation: 1 + rnd.Uint64N(1<<16)}},
		DataPlane: target.status.Node.DataPlane,
		// The prefill node's own model, as its status (and gossip) tells
		// anyone: the plan is refused for who sends it, not for its model.
		Model: p.status.Node.ModelFingerprint}
	we, err := r.ask(actor.NewPID(p.Addr, actors.PrefillName), m)
	return forbidden(Attack{Name: "transfer plan as a tenant", Node: p.Name, Want: names(trust.RefusedRole)}, we, err)
}

// send sends an operator's request, which the node must neither answer
// nor carry out.
func (r *RoguePeer) send(n roundTarget, what string, m messages.Message) Attack {
	a := Attack{Name: what + " as a tenant", Node: n.Name, Want: names(trust.RefusedRole), Refused: true}
	if err := messages.Send(r.sys.Root, actor.NewPID(n.Addr, cluster.ControlName), m); err != nil {
		a.Refused, a.Detail = false, err.Error()
	}
	return a
}

// count waits until every node's status counts the round's refusals and
// marks the attacks counted. A node that drained marks its drain attack
// not refused; the attacks on a node whose status cannot be read, or that
// restarted meanwhile, are skipped.
func (r *RoguePeer) count(ctx context.Context, c Cluster, nodes []roundTarget, as []Attack) error {
	deadline := time.Now().Add(rogueCountTimeout)
	done := map[string]bool{}
	for {
		unreachable := map[string]string{}
		pending := false
		for _, n := range nodes {
			if done[n.Name] {
				continue
			}
			s, err := c.Status(n.Addr)
			switch {
			case err != nil:
				unreachable[n.Name], pending = "its status after the round: "+err.Error(), true
			case s.Node.Incarnation != n.Incarnation:
				markSkipped(as, n.Name, "it restarted during the round")
				done[n.Name] = true
			case counted(n.status, s, as, n.Name):
				if s.Node.Draining {
					markDrained(as, n.Name)
				}
				done[n.Name] = true
			default:
				pending = true
			}
		}
		if !pending || time.Now().After(deadline) || ctx.Err() != nil {
			for node, why := range unreachable {
				markSkipped(as, node, why)
			}
			return ctx.Err()
		}
		wait(ctx, roguePoll)
	}
}

func markSkipped(as []Attack, node, why string) {
	for i := range as {
		if as[i].Node == node && !as[i].Counted {
			as[i].Skipped, as[i].Detail = true, strings.TrimPrefix(as[i].Detail+"; "+why, "; ")
		}
	}
}

func markDrained(as []Attack, node string) {
	for i := range as {
		if as[i].Node == node && strings.HasPrefix(as[i].Name, "drain") {
			as[i].Refused, as[i].Detail = false, "the node is draining"
		}
	}
}

// counted says whether the node's counts grew from before to after by
// its attacks in as: for every set of kinds some attack may be counted
// under, the growth of those kinds covers the attacks that may only be
// counted under them. When they do, its attacks are marked counted.
func counted(before, after *messages.StatusReply, as []Attack, node string) bool {
	growth := map[string]uint64{}
	for i, name := range trust.RefusalNames() {
		growth[name] = refusedCount(after, trust.Refusal(i)) - refusedCount(before, trust.Refusal(i))
	}
	for _, a := range as {
		if a.Node != node || a.Skipped {
			continue
		}
		var grown, need uint64
		for _, k := range a.Want {
			grown += growth[k]
		}
		for _, b := range as {
			if b.Node == node && !b.Skipped && subset(b.Want, a.Want) {
				need++
			}
		}
		if grown < need {
			return false
		}
	}
	for i := range as {
		if as[i].Node == node && !as[i].Skipped {
			as[i].Counted = true
		}
	}
	return true
}

func subset(a, b []string) bool {
	for _, x := range a {
		if !slices.Contains(b, x) {
			return false
		}
	}
	return true
}

//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC (see node_test.go); cmd/node's burst test runs a cluster of
// processes.

package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
)

// cluster5 is a router, two prefill and two decode nodes, each tuned by
// its tune (nil: as startNodeTuned makes it), all seeing each other.
type cluster5 struct {
	router, p0, p1, d0, d1 *Node
}

func startCluster5(t *testing.T, tune map[string]func(*NodeConfig)) cluster5 {
	t.Helper()
	start := func(name string, role actors.Role, join ...string) *Node {
		return startNodeTuned(t, testAuth(t, role), role, nil, tune[name], join...)
	}
	var c cluster5
	c.p0 = start("p0", actors.RolePrefill)
	c.p1 = start("p1", actors.RolePrefill, c.p0.GossipAddr())
	c.d0 = start("d0", actors.RoleDecode, c.p0.GossipAddr())
	c.d1 = start("d1", actors.RoleDecode, c.p0.GossipAddr())
	c.router = start("router", actors.RoleRouter, c.p0.GossipAddr())
	for _, n := range c.all() {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 5 && routable(n) })
	}
	return c
}

func (c cluster5) all() []*Node { return []*Node{c.router, c.p0, c.p1, c.d0, c.d1} }

// burstPrompt is the prompt of request i of a burst: of one length for
// every i, so that every request holds the same pages (checked by the
// test).
func burstPrompt(i int) string {
	return fmt.Sprintf("request %03d of a burst that one decode pool cannot hold. ", i)
}

// generateAnswers sends each prompt at once through c and checks every
// answer against the reference.
func generateAnswers(t *testing.T, n *Node, c *client.Client, prompts []string, maxTokens int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(prompts))
	for i, prompt := range prompts {
		wg.Go(func() {
			res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: maxTokens}, nil)
			if err == nil {
				want, _ := withModel(t, n.cfg).Model.Answer(prompt, maxTokens)
				if fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
					err = fmt.Errorf("got %v, reference %v", res.Tokens, want)
				}
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("request %d: %v", i, err)
		}
	}
}

// TestRouterBurstSpreads: a burst whose pages are more than one decode
// pool but within both is answered in full, the reference every time,
// with the requests (all of one size, so pages too) split within 25 %
// between the decode nodes, although gossip republishes free pages only
// every MetaInterval.
func TestRouterBurstSpreads(t *testing.T) {
	c := startCluster5(t, nil)
	cfg := c.router.cfg.Actors
	const maxTokens = 40
	prompts := make([]string, 0, 24)
	for i := range cap(prompts) {
		prompts = append(prompts, burstPrompt(i))
	}
	pagesOf := func(prompt string) int {
		tokens, _ := handoff.Encode(cfg.Limits(), withModel(t, c.router.cfg).Model.Tokenizer(), prompt, false)
		_, pages := handoff.RequestPages(cfg.Geometry(), len(tokens), maxTokens)
		return pages
	}
	pages := pagesOf(prompts[0])
	for i, p := range prompts {
		if pagesOf(p) != pages {
			t.Fatalf("prompt %d holds %d pages, prompt 0 %d", i, pagesOf(p), pages)
		}
	}
	burst := len(prompts) * pages
	if pool := c.d0.cfg.Actors.DecodePages; burst <= pool || burst > 2*pool {
		t.Fatalf("a burst of %d pages, decode pools of %d: want more than one pool, within two", burst, pool)
	}
	generateAnswers(t, c.router, tenantClient(t, c.router.Address(), "acme"), prompts, maxTokens)
	var served [2]uint64
	for i, d := range []*Node{c.d0, c.d1} {
		s, err := d.Actors().Status()
		if err != nil {
			t.Fatal(err)
		}
		served[i] = s.Admitted
	}
	t.Logf("%d requests of %d pages: decode-0 %d pages, decode-1 %d; %d sent again", len(prompts), pages,
		served[0]*uint64(pages), served[1]*uint64(pages), c.router.rc.retried.Load())
	if lo, hi := min(served[0], served[1]), max(served[0], served[1]); 4*(hi-lo) > hi {
		t.Errorf("decode nodes served %d and %d requests: more than 25 %% apart", served[0], served[1])
	}
	waitFor(t, "every pool free", time.Minute, func() bool { return allFree(c.p0, c.p1, c.d0, c.d1) })
}

// hog reserves every page of n's first pool, as requests the router does
// not know of would; n publishes no free pages (its MetaInterval is
// long), so gossip shows them all free.
func hog(t *testing.T, n *Node) {
	t.Helper()
	p := n.Actors().Pools()[0]
	s, err := p.Status(n.Actors().Root())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Reserve(n.Actors().Root(), kv.Owner{Request: 1 << 60, Tenant: "hog"}, 0, s.Capacity); err != nil {
		t.Fatal(err)
	}
}

// stale has a node publish its free pages once an hour: gossip keeps
// showing the pool as it started, all free; bigger, so that routing
// prefers it.
func stale(cfg *NodeConfig) {
	cfg.MetaInterval = time.Hour
	cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 128, 192
	cfg.Actors.ReserveWait = 200 * time.Millisecond
}

// TestRouterRetriesBusyDecode: the decode node routing prefers (gossip
// shows its larger pool all free) has no page free, and answers busy after
// its ReserveWait; the router sends the request to the other decode node
// before the client hears anything, and the client gets the reference.
func TestRouterRetriesBusyDecode(t *testing.T) {
	c := startCluster5(t, map[string]func(*NodeConfig){"d0": stale})
	hog(t, c.d0)
	const prompt, maxTokens = "a request the first decode node cannot take", 16
	generateAnswers(t, c.router, tenantClient(t, c.router.Address(), "acme"), []string{prompt}, maxTokens)
	s0, _ := c.d0.Actors().Status()
	s1, _ := c.d1.Actors().Status()
	if s0.RejectedBusy+s0.Failed != 1 || s1.Completed != 1 || c.router.Metrics().RetriedRoutes != 1 {
		t.Fatalf("decode-0 %+v, decode-1 %+v, router retried %d: want decode-0's busy sent on to decode-1",
			s0, s1, c.router.Metrics().RetriedRoutes)
	}
}

// TestPrefillBusyIsRetried: the prefill node the router names (gossip
// shows its larger pool all free) has no page free and answers the plan
// busy; the decode node plans with the other prefill node before any token
// (handoff.Request's retry), and the client gets the reference.
func TestPrefillBusyIsRetried(t *testing.T) {
	c := startCluster5(t, map[string]func(*NodeConfig){"p0": stale})
	hog(t, c.p0)
	prompts := []string{strings.Repeat("a prompt for a prefill node with no page free. ", 2)}
	generateAnswers(t, c.router, tenantClient(t, c.router.Address(), "acme"), prompts, 8)
	var retried uint64
	for _, d := range []*Node{c.d0, c.d1} {
		retried += d.Metrics().RetriedTransfers
	}
	if retried != 1 {
		t.Fatalf("decode nodes retried %d transfers, want the one prefill-0 refused", retried)
	}
}

// inbox is a local actor that hands every message it gets to a channel,
// as a client would see them.
type inbox chan any

func (in inbox) Receive(c actor.Context) {
	switch m := c.Message().(type) {
	case *messages.TokenChunk, *messages.GenerateResult:
		in <- m
	}
}

// TestRouterRetriesStaleIncarnation: gossip (doctored here, as a node that
// restarted at its address before gossip said so) names decode-0 with an
// earlier run's incarnation and the most free pages; decode-0 answers the
// routed request node lost, and the router sends it to decode-1 under the
// same relay, so that the client sees the reference and nothing else.
func TestRouterRetriesStaleIncarnation(t *testing.T) {
	c := startCluster5(t, nil)
	n := c.router
	members := func() []Member {
		ms := n.membersNow()
		for i := range ms {
			if ms[i].Meta.Incarnation == c.d0.Incarnation() {
				ms[i].Meta.Incarnation++ // an earlier run, as gossip still shows it
				ms[i].Meta.CapacityPages, ms[i].Meta.FreePages = 1000, 1000
			}
		}
		return ms
	}
	counters := &routerCounters{}
	r := &routerActor{cfg: &n.cfg.Actors, model: n.actors.Model(), members: members, draining: func() bool { return false },
		log: n.log, counters: counters, auth: n.cfg.Auth, mailbox: n.actors.Mailbox(), streams: n.actors.Streams(),
		routing: NewRouting(rand.NewPCG(1, 2))}
	pid, err := n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return r }), "stale-router")
	if err != nil {
		t.Fatal(err)
	}
	got := make(inbox, 64)
	client, err := n.actors.Root().SpawnNamed(actor.PropsFromProducer(func() actor.Actor { return got }), "stale-client")
	if err != nil {
		t.Fatal(err)
	}
	const prompt, maxTokens = "routed to a run that is gone", 8
	n.actors.Root().RequestWithCustomSender(pid, &messages.GenerateRequest{RequestID: 1, Tenant: "acme", Prompt: prompt,
		MaxTokens: maxTokens}, client)
	var tokens []int
	for res := (*messages.GenerateResult)(nil); res == nil; {
		select {
		case m := <-got:
			switch m := m.(type) {
			case *messages.TokenChunk:
				for _, tok := range m.Tokens {
					tokens = append(tokens, int(tok))
				}
			case *messages.GenerateResult:
				if m.Err != nil {
					t.Fatalf("the client heard %+v", m.Err)
				}
				res = m
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no answer within 30 s; %d tokens", len(tokens))
		}
	}
	want, _ := withModel(t, n.cfg).Model.Answer(prompt, maxTokens)
	if fmt.Sprint(tokens) != fmt.Sprint(want) || counters.retried.Load() != 1 || counters.completed.Load() != 1 {
		t.Fatalf("tokens %v (reference %v), retried %d, completed %d", tokens, want, counters.retried.Load(),
			counters.completed.Load())
	}
	if s, _ := c.d1.Actors().Status(); s.Completed != 1 {
		t.Fatalf("decode-1 completed %d requests, want the one sent on", s.Completed)
	}
}

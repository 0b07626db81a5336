//go:build !race

// Several protoactor remote instances in one process race inside protoactor
// and gRPC (logger setup, endpoint manager), which the race detector reports
// although kvwarden's code is not involved. The cmd/node tests run the same
// cluster as separate processes of the real binary.

package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"

	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// testAuth is the credentials of a node of role, from the package's
// shared test CA; tenantAuth a tenant's client's.
func testAuth(t testing.TB, role actors.Role) *trust.Authority {
	return trusttest.Shared(t).Authority(t, trust.Role(role), "0", nil)
}

func tenantAuth(t testing.TB, tenant string) *trust.Authority {
	return trusttest.Shared(t).Authority(t, trust.RoleTenant, tenant, nil)
}

// tenantClient dials addr as tenant.
func tenantClient(t testing.TB, addr, tenant string) *client.Client {
	t.Helper()
	c, err := client.Dial(addr, client.Options{Auth: tenantAuth(t, tenant)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// withModel is cfg serving, unless it names a model, the built-in model of
// cfg.Actors.Model.
func withModel(t testing.TB, cfg NodeConfig) NodeConfig {
	t.Helper()
	if cfg.Model == nil {
		cfg.Model = modeltest.Builtin(t, cfg.Actors.Model)
	}
	return cfg
}

func startClusterNode(t testing.TB, role actors.Role, join ...string) *Node {
	t.Helper()
	return startNodeAs(t, testAuth(t, role), role, join...)
}

// startNodeAs starts a node of role holding auth's credentials.
func startNodeAs(t testing.TB, auth *trust.Authority, role actors.Role, join ...string) *Node {
	t.Helper()
	return startNodeServing(t, auth, role, nil, join...)
}

// startNodeServing is startNodeAs serving model (nil: the built-in one).
func startNodeServing(t testing.TB, auth *trust.Authority, role actors.Role, model *engine.Model, join ...string) *Node {
	t.Helper()
	return startNodeTuned(t, auth, role, model, nil, join...)
}

// startNodeTuned is startNodeServing with the configuration changed by
// tune, if not nil, before the node starts.
func startNodeTuned(t testing.TB, auth *trust.Authority, role actors.Role, model *engine.Model, tune func(*NodeConfig),
	join ...string) *Node {
	t.Helper()
	cfg := DefaultLocalNodeConfig(role)
	if model != nil {
		cfg.Model, cfg.Actors.Model = model, model.Config()
	}
	cfg.Auth = auth
	cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 64, 96
	cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 512, 64
	if model != nil {
		cfg.Actors.MaxTokensMax = 256 // room for stories260K's published story
	}
	// PrefillTimeout stays DefaultLocalConfig's 20 s, as long as a loaded
	// machine may take to prefill a burst: the bound decides only how long
	// a broken cluster takes to fail a test; a prefill node that dies is
	// failed over when membership loses it.
	cfg.Gossip.JoinAddrs = join
	if tune != nil {
		tune(&cfg)
	}
	n, err := StartNode(withModel(t, cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop() })
	return n
}

func aliveCount(n *Node) int {
	c := 0
	for _, m := range n.Members() {
		if m.State == StateAlive {
			c++
		}
	}
	return c
}

// routable says whether every member n sees is verified, so that n
// routes to all of them.
func routable(n *Node) bool {
	for _, m := range n.Members() {
		if !m.Verified {
			return false
		}
	}
	return true
}

// freeEverywhere waits until every pool of every node is entirely free:
// pages are released after the answer (on acknowledgements), so a check
// right after it would see those of a loaded machine still in use.
func freeEverywhere(t *testing.T, nodes ...*Node) {
	t.Helper()
	testwait.Report(t, "every pool free", time.Minute, func() (bool, string) {
		for _, n := range nodes {
			if inUse, err := n.Actors().PagesInUse(); err != nil || inUse != 0 {
				return false, fmt.Sprintf("%s node: %d pages still in use (%v)", n.cfg.Actors.Role, inUse, err)
			}
		}
		return true, ""
	})
}

// allFree says whether every pool of every node is entirely free.
func allFree(nodes ...*Node) bool {
	for _, n := range nodes {
		if inUse, err := n.Actors().PagesInUse(); err != nil || inUse != 0 {
			return false
		}
	}
	return true
}

// startTrio starts a prefill, a decode and a router node, waits until they
// all see each other, and dials the router.
func startTrio(t *testing.T) (p, d, r *Node, c *client.Client) {
	t.Helper()
	return startTrioServing(t, nil)
}

// startTrioServing is startTrio serving model (nil: the built-in one).
func startTrioServing(t *testing.T, model *engine.Model) (p, d, r *Node, c *client.Client) {
	t.Helper()
	p = startNodeServing(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, model)
	d = startNodeServing(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, model, p.GossipAddr())
	r = startNodeServing(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, model, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	c, err := client.Dial(r.Address(), client.Options{Auth: tenantAuth(t, "acme")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return p, d, r, c
}

// startGatedTrio starts a prefill node, a decode node whose peers reach
// its data plane through a gate (open), and a router tuned by tuneRouter
// (nil: as it is), and waits until they all see each other: a test shuts
// the gate to hold every transfer to the decode node.
func startGatedTrio(t *testing.T, tuneRouter func(*NodeConfig)) (p, d, r *Node, gate *testnet.Gate) {
	t.Helper()
	gate = testnet.NewGate(t)
	dataListen := trusttest.ClosedAddr(t)
	gate.Open(dataListen)
	p = startClusterNode(t, actors.RolePrefill)
	d = startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, func(cfg *NodeConfig) {
		cfg.DataListen, cfg.DataAdvertise = dataListen, gate.Addr()
	}, p.GossipAddr())
	r = startNodeTuned(t, testAuth(t, actors.RoleRouter), actors.RoleRouter, nil, tuneRouter, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	return p, d, r, gate
}

// TestOtherModelNotRouted: a prefill node serving other weights joins the
// cluster but gets no work; with no prefill node of the router's model,
// a request is refused as unavailable, naming the other model's members,
// and nothing is computed.
func TestOtherModelNotRouted(t *testing.T) {
	cfg := actors.DefaultLocalConfig().Model
	cfg.Seed++
	other := modeltest.Builtin(t, cfg)
	p := startNodeServing(t, testAuth(t, actors.RolePrefill), actors.RolePrefill, other)
	d := startClusterNode(t, actors.RoleDecode, p.GossipAddr())
	r := startClusterNode(t, actors.RoleRouter, p.GossipAddr())
	for _, n := range []*Node{p, d, r} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 })
	}
	if fp := d.actors.Model().Fingerprint(); fp == other.Fingerprint() {
		t.Fatalf("two seeds, one fingerprint %s", fp)
	}
	_, err := tenantClient(t, r.Address(), "acme").Generate(context.Background(), "acme", "hello",
		client.GenerateOptions{MaxTokens: 4}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeUnavailable || !strings.Contains(we.Message, "0 prefill nodes of model") ||
		!strings.Contains(we.Message, "1 members serve other models") {
		t.Fatalf("a request with only another model's prefill node: %v", err)
	}
	if s := p.status(); s.Node.InFlight != 0 || !allFree(p) || s.Node.ModelFingerprint != other.Fingerprint().String() {
		t.Fatalf("the other model's prefill node: %+v", s.Node)
	}
}

func TestRouterPrefillDecode(t *testing.T) {
	p, d, r, _ := startTrio(t)
	clients := make([]*client.Client, 3)
	for i := range clients {
		clients[i] = tenantClient(t, r.Address(), fmt.Sprintf("t%d", i))
	}
	var wg sync.WaitGroup
	errs := make([]error, 8)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			prompt := strings.Repeat(fmt.Sprintf("tenant %d prompt; ", i%3), 10)[:10+i*17]
			res, err := clients[i%3].Generate(context.Background(), fmt.Sprintf("t%d", i%3), prompt, client.GenerateOptions{MaxTokens: 12}, nil)
			if err == nil {
				want, _ := withModel(t, r.cfg).Model.Answer(prompt, 12)
				if fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
					err = fmt.Errorf("prompt %d: got %v, reference %v", i, res.Tokens, want)
				}
			}
			errs[i] = err
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	freeEverywhere(t, p, d)
}

// TestPrefillLostMidTransferIsRetried kills (no graceful leave) the prefill
// node a request was planned on while it holds the transfer: the request
// is retried on the other prefill node before any token was streamed and
// answers the reference; the survivors' pools end entirely free. The
// decode node's data plane is reached through a gate, shut while the
// doomed node dials it, so that the doomed node cannot finish first
// however fast it computes.
func TestPrefillLostMidTransferIsRetried(t *testing.T) {
	gate := testnet.NewGate(t)
	dataListen := trusttest.ClosedAddr(t)
	gate.Open(dataListen)
	big := DefaultLocalNodeConfig(actors.RolePrefill)
	big.Auth = testAuth(t, actors.RolePrefill)
	big.Actors.PrefillPages, big.Actors.ContextTokens, big.Actors.MaxTokensMax = 128, 512, 64
	big.DataPlane.DialTimeout = time.Minute // its dial is held until it dies
	doomed, err := StartNode(withModel(t, big), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { doomed.Stop() })
	spare := startClusterNode(t, actors.RolePrefill, doomed.GossipAddr())
	d := startNodeTuned(t, testAuth(t, actors.RoleDecode), actors.RoleDecode, nil, func(cfg *NodeConfig) {
		cfg.DataListen, cfg.DataAdvertise = dataListen, gate.Addr()
	}, doomed.GossipAddr())
	for _, n := range []*Node{doomed, spare, d} {
		waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(n) == 3 && routable(n) })
	}
	// The doomed node has the most free pages, so decode plans with it
	// first.
	waitFor(t, "decode sees the doomed node's pool", time.Minute, func() bool {
		p, ok := d.pickPrefill(nil)
		return ok && p.Incarnation == doomed.Incarnation()
	})
	c, err := client.Dial(d.Address(), client.Options{Auth: tenantAuth(t, "acme")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	gate.Shut()
	prompt := strings.Repeat("a long prompt keeps prefill busy. ", 12)[:400]
	type answer struct {
		tokens []int
		err    error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 8}, nil)
		done <- answer{res.Tokens, err}
	}()
	waitFor(t, "the doomed node's transfer held at the gate", time.Minute, func() bool {
		return doomed.Metrics().PrefillInFlight == 1 && gate.Held() >= 1
	})
	gate.Open(dataListen) // for the spare's dial, once the loss is seen
	doomed.shutdown()     // no leave: a crash, as the others see it
	got := testwait.Recv(t, "the answer", time.Minute, done)
	if got.err != nil {
		t.Fatalf("request after its prefill node died: %v", got.err)
	}
	want, _ := withModel(t, d.cfg).Model.Answer(prompt, 8)
	if fmt.Sprint(got.tokens) != fmt.Sprint(want) {
		t.Fatalf("retried answer %v, reference %v", got.tokens, want)
	}
	if s, _ := d.Actors().Status(); s.Retried == 0 {
		t.Errorf("decode status shows no retry: %+v", s)
	}
	waitFor(t, "survivors' pools free after the reclaim deadline", time.Minute, func() bool { return allFree(spare, d) })
}

// TestDecodeLostFailsCleanly kills (no graceful leave) the decode node
// while its request's KV is in transfer: the router answers the client
// "node lost", never a partial or wrong answer, and the prefill node's pool
// is entirely free again (pages sent and never acknowledged go at their
// reclaim deadline). The decode node's data plane is reached through a
// gate, shut while the prefill node dials it, so that the request is in
// transfer when the kill lands however fast the machine is.
func TestDecodeLostFailsCleanly(t *testing.T) {
	p, d, r, gate := startGatedTrio(t, nil)
	c := tenantClient(t, r.Address(), "acme")
	gate.Shut()
	done := make(chan error, 1)
	go func() {
		_, err := c.Generate(context.Background(), "acme", strings.Repeat("a long prompt in transfer. ", 16)[:400],
			client.GenerateOptions{MaxTokens: 64}, nil)
		done <- err
	}()
	waitFor(t, "the prefill node's transfer held at the gate", time.Minute, func() bool {
		return p.Metrics().PrefillInFlight == 1 && gate.Held() >= 1
	})
	d.shutdown()
	err := testwait.Recv(t, "the answer", time.Minute, done)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeNodeLost {
		t.Fatalf("request on a dead decode node: %v, want node_lost", err)
	}
	waitFor(t, "prefill pool free after the reclaim deadline", time.Minute, func() bool { return allFree(p) })
}

// TestTransferAfterIdleDataPlane: the decode node closes data-plane
// connections idle past IdleTimeout; the next transfer dials afresh
// instead of failing on the dead connection.
func TestTransferAfterIdleDataPlane(t *testing.T) {
	cfg := DefaultLocalNodeConfig(actors.RoleDecode)
	cfg.Auth = testAuth(t, actors.RoleDecode)
	cfg.DataPlane.IdleTimeout = 200 * time.Millisecond
	p := startClusterNode(t, actors.RolePrefill)
	cfg.Gossip.JoinAddrs = []string{p.GossipAddr()}
	d, err := StartNode(withModel(t, cfg), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Stop() })
	waitFor(t, "membership converges", time.Minute, func() bool { return aliveCount(d) == 2 && routable(d) })
	c, err := client.Dial(d.Address(), client.Options{Auth: tenantAuth(t, "acme")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 2 {
		prompt := fmt.Sprintf("request %d after an idle data plane", i)
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 4}, nil)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		if want, _ := withModel(t, cfg).Model.Answer(prompt, 4); fmt.Sprint(res.Tokens) != fmt.Sprint(want) {
			t.Fatalf("request %d: %v, reference %v", i, res.Tokens, want)
		}
		// The scenario is an idle period: the server closes the
		// connection the transfer used.
		waitFor(t, fmt.Sprintf("%d data-plane connections closed idle", i+1), time.Minute, func() bool {
			return d.data.Stats().IdleClosed == uint64(i+1)
		})
	}
	if s, _ := d.Actors().Status(); s.Retried != 0 {
		t.Errorf("a healthy prefill node was retried away from: %+v", s)
	}
}

// TestRouterDrainFinishesRelays: draining a router lets the requests it
// relays finish before it leaves, and refuses new ones meanwhile.
func TestRouterDrainFinishesRelays(t *testing.T) {
	_, _, r, c := startTrio(t)
	const prompt, maxTokens = "a request the router relays while it drains", 48
	done := make(chan error, 1)
	first := make(chan struct{}, maxTokens)
	var got []int
	go func() {
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: maxTokens},
			func(int) { first <- struct{}{} })
		got = res.Tokens
		done <- err
	}()
	select {
	case <-first:
	case err := <-done:
		t.Fatalf("the request ended before its first token: %v", err)
	case <-time.After(time.Minute):
		t.Fatal("no first token within a minute")
	}
	left, err := r.drainWait(time.Now().Add(r.cfg.DrainTimeout))
	if err != nil || left != 0 {
		t.Fatalf("router drain: %d left, %v", left, err)
	}
	if err := testwait.Recv(t, "the answer", time.Minute, done); err != nil {
		t.Fatalf("request relayed through a draining router: %v", err)
	}
	if want, _ := withModel(t, r.cfg).Model.Answer(prompt, maxTokens); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("answer through a draining router: %v, reference %v", got, want)
	}
	_, err = c.Generate(context.Background(), "acme", "too late", client.GenerateOptions{MaxTokens: 2}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeBusy {
		t.Fatalf("new request to a draining router: %v, want busy", err)
	}
}

// TestMembershipChangesLogged: a node logs a member that joins and one
// that leaves, at info, with its name and role.
func TestMembershipChangesLogged(t *testing.T) {
	var logs testwait.Buffer
	cfg := DefaultLocalNodeConfig(actors.RoleAll)
	cfg.Auth = testAuth(t, actors.RoleAll)
	cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 64, 96
	cfg.Actors.ContextTokens = 512
	a, err := StartNode(withModel(t, cfg), slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Stop() })
	b := startClusterNode(t, actors.RolePrefill, a.GossipAddr())
	name := ""
	waitFor(t, "b joined in a's log", time.Minute, func() bool {
		for _, m := range a.Members() {
			if m.Meta.Incarnation == b.Incarnation() {
				name = m.Name
			}
		}
		return name != "" && strings.Contains(logs.String(), `msg="member joined" name=`+name+` role=prefill`)
	})
	if err := b.Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "b left in a's log", time.Minute, func() bool {
		return strings.Contains(logs.String(), `msg="member left" name=`+name+` role=prefill`)
	})
}

// TestPrefillNodeIsNotAdmission: a generate sent to a prefill node is
// answered at once that it is not an admission endpoint, naming the role,
// rather than left to the client's silence bound.
func TestPrefillNodeIsNotAdmission(t *testing.T) {
	cfg := DefaultLocalNodeConfig(actors.RolePrefill)
	p := startNodeServing(t, trust.Insecure(nil), actors.RolePrefill, modeltest.Builtin(t, cfg.Actors.Model))
	c, err := client.Dial(p.Address(), client.Options{Auth: trust.Insecure(nil), NoAnswerAfter: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, err = c.Generate(context.Background(), "acme", "hi", client.GenerateOptions{MaxTokens: 2}, nil)
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != messages.CodeBadRequest || !strings.Contains(we.Message, "not an admission endpoint (role prefill)") {
		t.Fatalf("a generate to a prefill node: %v", err)
	}
}

// TestTokenPromptFromATenantRefused: a tenant's prompt is text. A prompt
// written as a prompt of tokens (what a node's own API sends for a chat in
// the model's template) is refused, bad_request, from a tenant over the
// actor API, whether it reaches a router or a decode node's admission,
// however valid its tokens (here BOS, stop and BOS again, which no text
// encodes to); the same text then in the middle of a prompt is text.
func TestTokenPromptFromATenantRefused(t *testing.T) {
	_, d, r, c := startTrio(t)
	tok := r.Actors().Model().Tokenizer()
	forged := handoff.TokenPrompt([]int{tok.BOS(), tok.BOS(), tok.Stop(), tok.BOS(), 'h', 'i'})
	direct := tenantClient(t, d.Address(), "acme")
	for name, cl := range map[string]*client.Client{"router": c, "decode node": direct} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := cl.Generate(ctx, "acme", forged, client.GenerateOptions{MaxTokens: 4}, nil)
		cancel()
		var we *messages.WireError
		if !errors.As(err, &we) || we.Code != messages.CodeBadRequest || !strings.Contains(we.Message, "only a node's own API sends") {
			t.Errorf("a token prompt sent to the %s: %v; want bad_request", name, err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res, err := c.Generate(ctx, "acme", "x"+forged, client.GenerateOptions{MaxTokens: 4}, nil)
	want, werr := r.Actors().Model().Answer("x"+forged, 4)
	if err != nil || werr != nil || !slices.Equal(res.Tokens, want) {
		t.Fatalf("the mark within a text prompt: %+v, %v; want the answer to it as text, %v (%v)", res, err, want, werr)
	}
}

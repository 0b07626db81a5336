//go:build !race

// Several nodes in one process, each serving protoactor remote: see
// ops_test.go.

package httpapi

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/cluster"
	"github.com/kvwarden/kvwarden/cluster/dataplane"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/internal/modeltest"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/tenancy"
	"github.com/kvwarden/kvwarden/trust"
)

// everyNewSeriesAtZero checks that every series of the queues, transfers,
// integrity refusals and admission bounds is in scrape, at zero.
func everyNewSeriesAtZero(t *testing.T, scrape string) {
	t.Helper()
	series := []string{`kvwarden_requests_running`, `kvwarden_requests_retried_total{by="router"}`,
		`kvwarden_requests_retried_total{by="decode"}`, `kvwarden_prompt_tokens_total`, `kvwarden_generation_tokens_total`,
		`kvwarden_relayed_tokens_total`}
	for _, q := range []string{"routed", "decode_pages", "decode_transfer", "prefill", "prefill_transfer"} {
		series = append(series, `kvwarden_requests_waiting{queue="`+q+`"}`)
	}
	for _, b := range actors.RejectBoundNames() {
		series = append(series, `kvwarden_admission_rejections_total{bound="`+b+`"}`)
	}
	for _, r := range actors.IntegrityReasonNames() {
		series = append(series, `kvwarden_integrity_refusals_total{reason="`+r+`"}`)
	}
	for _, side := range []string{"send", "receive"} {
		series = append(series, `kvwarden_kv_transfer_duration_seconds_count{side="`+side+`"}`,
			`kvwarden_kv_transfer_duration_seconds_bucket{side="`+side+`",le="+Inf"}`,
			`kvwarden_kv_transfer_bytes_total{side="`+side+`"}`, `kvwarden_kv_transfer_pages_total{side="`+side+`"}`)
		for _, code := range messages.KnownCodes() {
			series = append(series, `kvwarden_kv_transfer_failures_total{code="`+code.String()+`",side="`+side+`"}`)
		}
	}
	for _, s := range series {
		if v := metric(t, scrape, s); v != 0 {
			t.Errorf("%s is %g at start, want 0", s, v)
		}
	}
}

// wantSeries checks each series' value in scrape.
func wantSeries(t *testing.T, when, scrape string, want map[string]float64) {
	t.Helper()
	for s, w := range want {
		if v := metric(t, scrape, s); v != w {
			t.Errorf("%s: %s is %g, want %g", when, s, v, w)
		}
	}
}

// scrape is n's /metrics.
func scrape(t *testing.T, srv *httptest.Server) string {
	t.Helper()
	code, body := get(t, srv.URL+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	return body
}

// kvOf is the tokens, KV pages and bytes of prompts' prefills on n: what
// their transfers carry.
func kvOf(t *testing.T, n *cluster.Node, prompts ...string) (tokens, pages, bytes float64) {
	t.Helper()
	cfg := n.Actors().Config()
	g := cfg.Geometry()
	for _, p := range prompts {
		prompt, err := handoff.Encode(cfg.Limits(), n.Actors().Model().Tokenizer(), p, false)
		if err != nil {
			t.Fatal(err)
		}
		tokens += float64(len(prompt))
		pages += float64(g.PagesFor(len(prompt)))
		bytes += float64(len(prompt) * g.BytesPerToken())
	}
	return tokens, pages, bytes
}

// startAs is a real insecure node of role (with edit's changes to its
// configuration) joined to join, behind a test HTTP server of its
// handlers.
func startAs(t testing.TB, role actors.Role, edit func(*cluster.NodeConfig), join ...string) (*cluster.Node, *httptest.Server) {
	t.Helper()
	return startLogged(t, role, edit, nil, join...)
}

// startLogged is startAs with the node's log to log.
func startLogged(t testing.TB, role actors.Role, edit func(*cluster.NodeConfig), log *slog.Logger,
	join ...string) (*cluster.Node, *httptest.Server) {
	t.Helper()
	cfg := cluster.DefaultLocalNodeConfig(role)
	cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 64, 96
	cfg.Actors.ContextTokens, cfg.Actors.MaxTokensMax = 512, 64
	cfg.Auth = trust.Insecure(nil)
	cfg.Gossip.JoinAddrs = join
	if edit != nil {
		edit(&cfg)
	}
	cfg.Model = modeltest.Builtin(t, cfg.Actors.Model)
	n, err := cluster.StartNode(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Stop() })
	return n, serve(t, n)
}

func dial(t testing.TB, n *cluster.Node) *client.Client {
	t.Helper()
	c, err := client.Dial(n.Address(), client.Options{Auth: trust.Insecure(nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// refusedWith checks that err is the refusal of a request with code.
func refusedWith(t *testing.T, what string, err error, code messages.ErrorCode) {
	t.Helper()
	var we *messages.WireError
	if !errors.As(err, &we) || we.Code != code {
		t.Fatalf("%s: %v, want %s", what, err, code)
	}
}

// TestAdmissionRejectionsByBound: each refusal of a node of role all is
// counted once, under the bound its error names; the by-code counts move
// with them.
func TestAdmissionRejectionsByBound(t *testing.T) {
	n, srv := startAs(t, actors.RoleAll, func(cfg *cluster.NodeConfig) {
		cfg.Actors.PrefillPages, cfg.Actors.DecodePages = 24, 8 // 384 and 128 tokens
	})
	c := dial(t, n)
	gen := func(prompt string, maxTokens int) error {
		_, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: maxTokens}, nil)
		return err
	}
	// 601 tokens in a 512-token window, and 501 with 64 more to generate.
	refusedWith(t, "over the window", gen(strings.Repeat("x", 600), 1), messages.CodePromptTooLong)
	refusedWith(t, "over the window with max_tokens", gen(strings.Repeat("x", 500), 64), messages.CodePromptTooLong)
	// 401 tokens: 26 pages of 16, the prefill pool holds 24.
	refusedWith(t, "over the prefill pool", gen(strings.Repeat("x", 400), 1), messages.CodePromptTooLong)
	// 101 tokens and 63 more: 7 + 4 pages, the decode pool holds 8.
	refusedWith(t, "over the decode pool", gen(strings.Repeat("x", 100), 64), messages.CodePromptTooLong)
	refusedWith(t, "max_tokens over MaxTokensMax", gen("x", 65), messages.CodeBadRequest)
	// The admission's drain: the node's own leaves once it is done.
	if _, err := n.Actors().Drain(); err != nil {
		t.Fatal(err)
	}
	refusedWith(t, "while draining", gen("x", 1), messages.CodeBusy)
	wantSeries(t, "after six refusals", scrape(t, srv), map[string]float64{
		`kvwarden_admission_rejections_total{bound="context_window"}`: 2,
		`kvwarden_admission_rejections_total{bound="prefill_pool"}`:   1,
		`kvwarden_admission_rejections_total{bound="decode_pool"}`:    1,
		`kvwarden_admission_rejections_total{bound="bad_request"}`:    1,
		`kvwarden_admission_rejections_total{bound="draining"}`:       1,
		`kvwarden_admission_rejections_total{bound="queue"}`:          0,
		`kvwarden_admission_rejections_total{bound="other"}`:          0,
		`kvwarden_requests_rejected_total{reason="prompt_too_long"}`:  4,
		`kvwarden_requests_rejected_total{reason="busy"}`:             1,
		`kvwarden_requests_admitted_total`:                            0,
		`kvwarden_kv_transfer_duration_seconds_count{side="send"}`:    0,
	})
}

// TestRouterRejectionsByBound: a router with no node to route to refuses
// for want of a peer, as unavailable, not busy.
func TestRouterRejectionsByBound(t *testing.T) {
	r, srv := startAs(t, actors.RoleRouter, nil)
	_, err := dial(t, r).Generate(context.Background(), "acme", "x", client.GenerateOptions{MaxTokens: 1}, nil)
	refusedWith(t, "no node to route to", err, messages.CodeUnavailable)
	wantSeries(t, "after the refusal", scrape(t, srv), map[string]float64{
		`kvwarden_admission_rejections_total{bound="no_peer"}`:   1,
		`kvwarden_admission_rejections_total{bound="draining"}`:  0,
		`kvwarden_requests_rejected_total{reason="busy"}`:        0,
		`kvwarden_requests_rejected_total{reason="unavailable"}`: 1,
	})
}

// startPair starts a prefill node and a decode node (with edit's changes
// to each one's configuration, whose Actors.Role says which) that see
// each other.
func startPair(t *testing.T, edit func(*cluster.NodeConfig)) (p, d *cluster.Node, ps, ds *httptest.Server) {
	t.Helper()
	p, ps = startAs(t, actors.RolePrefill, edit)
	d, ds = startAs(t, actors.RoleDecode, edit, p.GossipAddr())
	testwait.For(t, "the decode node sees the prefill node", time.Minute, func() bool { return d.Ready() == nil })
	return p, d, ps, ds
}

// trio is a prefill, a decode and a router node, each behind a test HTTP
// server of its handlers.
type trio struct {
	p, d, r    *cluster.Node
	ps, ds, rs *httptest.Server
}

// startTrio starts a trio (with edit's changes to each node's
// configuration, whose Actors.Role says which) and waits until the router
// and the decode node see the nodes they need.
func startTrio(t testing.TB, edit func(*cluster.NodeConfig)) trio {
	t.Helper()
	var n trio
	n.p, n.ps = startAs(t, actors.RolePrefill, edit)
	n.d, n.ds = startAs(t, actors.RoleDecode, edit, n.p.GossipAddr())
	n.r, n.rs = startAs(t, actors.RoleRouter, edit, n.p.GossipAddr())
	testwait.For(t, "the router sees both nodes", time.Minute, func() bool { return n.r.Ready() == nil && n.d.Ready() == nil })
	return n
}

// TestTokenCounters: requests through a router count their prompt tokens
// on the prefill node, which computed them, and their tokens on the decode
// node, which generated them, as generated, and on the router as relayed:
// each token once per name, so that a sum over the nodes is the
// cluster's. The status's tokens out say the same.
func TestTokenCounters(t *testing.T) {
	n := startTrio(t, nil)
	c := dial(t, n.r)
	prompts := []string{"one", strings.Repeat("a page and more ", 3), strings.Repeat("z", 47)}
	generated := 0.0
	for i, prompt := range prompts {
		res, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 3 + i}, nil)
		if err != nil {
			t.Fatal(err)
		}
		generated += float64(len(res.Tokens))
	}
	prompt, _, _ := kvOf(t, n.d, prompts...)
	for _, node := range []struct {
		name               string
		srv                *httptest.Server
		status             *cluster.Node
		prompt, gen, relay float64
	}{{"prefill", n.ps, n.p, prompt, 0, 0}, {"decode", n.ds, n.d, 0, generated, 0}, {"router", n.rs, n.r, 0, 0, generated}} {
		body := scrape(t, node.srv)
		wantSeries(t, "the "+node.name+" node", body, map[string]float64{
			`kvwarden_prompt_tokens_total`: node.prompt, `kvwarden_generation_tokens_total`: node.gen,
			`kvwarden_relayed_tokens_total`: node.relay})
		if out := node.status.Status().Node.TokensOut; float64(out) != node.gen+node.relay {
			t.Errorf("the %s node's status counts %d tokens out, want %g", node.name, out, node.gen+node.relay)
		}
		// The first tokens' phases: counted by the decode node alone, once
		// a request; every request waits for its prefill and for decode's
		// checks.
		want, ft := 0.0, node.status.Status().Node.FirstToken
		if node.status == n.d {
			want = float64(len(prompts))
			// Every request asks for 3 tokens or more: each had a first
			// decode step.
			if ft == nil || ft.Requests != uint64(len(prompts)) || ft.PrefillNs == 0 || ft.VerifyNs == 0 ||
				ft.Decoded != uint64(len(prompts)) || ft.FirstDecodeNs == 0 {
				t.Errorf("the decode node's status splits its first tokens as %+v, want %d requests with prefill, verify and a first decode step",
					ft, len(prompts))
			}
		} else if ft != nil {
			t.Errorf("the %s node's status splits first tokens (%+v), want none", node.name, ft)
		}
		for _, ph := range []string{"queue", "prefill", "transfer", "verify", "first_decode"} {
			wantSeries(t, "the "+node.name+" node", body, map[string]float64{
				`kvwarden_first_token_phase_seconds_count{phase="` + ph + `"}`: want})
		}
		if sum := metric(t, body, `kvwarden_first_token_phase_seconds_sum{phase="prefill"}`); (sum > 0) != (want > 0) {
			t.Errorf("the %s node's first tokens spent %gs in prefill, over %g requests", node.name, sum, want)
		}
	}
}

// TestRequestsWaitingWhereHeld: requests held at known places of a real
// router, prefill and decode node are counted waiting where they are held,
// each once per node, and nowhere else. The decode node's data plane, as
// it advertises it, accepts connections and never answers; the prefill
// node sends one transfer at a time; the decode pool holds three requests'
// pages. Of five requests through the router, the first transfer hangs on
// the data plane (prefill_transfer), two more wait behind it at the prefill
// node (prefill), the three wait for their KV at the decode node
// (decode_transfer) while two more wait for its pages (decode_pages), and
// the router has seen none of the five start (routed). When the data plane
// goes, every request ends and every queue is empty again.
func TestRequestsWaitingWhereHeld(t *testing.T) {
	hole, release := blackHole(t)
	const held = 3 // requests whose pages the decode pool holds
	n := startTrio(t, func(cfg *cluster.NodeConfig) {
		// Nothing gives up on its own while the test looks: every bound on
		// the path is far beyond the test's own wait.
		a := &cfg.Actors
		a.RequestTimeout, a.PrefillTimeout, a.ReserveWait, a.OwnedPageTimeout = 4*time.Minute, 4*time.Minute, 4*time.Minute, 5*time.Minute
		cfg.DataPlane.DialTimeout = 4 * time.Minute
		switch a.Role {
		case actors.RolePrefill:
			a.TransferSendsMax = 1
		case actors.RoleDecode:
			cfg.DataAdvertise = hole
			a.DecodePages = held // a page each: a few prompt tokens and one to generate
			// The one tenant may fill the pool: what holds the two more
			// requests back is the pool, not the tenant's share of it.
			all := tenancy.DefaultShare()
			all.PoolPercentMax = 100
			a.Tenants = tenancy.NewShares(&tenancy.Policy{Default: all})
		}
	})
	c := dial(t, n.r)
	const sent = held + 2
	ended := make(chan error, sent)
	for i := range sent {
		go func() {
			_, err := c.Generate(context.Background(), "acme", fmt.Sprintf("held %d", i), client.GenerateOptions{MaxTokens: 1}, nil)
			ended <- err
		}()
	}
	want := map[*httptest.Server]map[string]float64{
		n.rs: {"routed": sent},
		n.ds: {"decode_transfer": held, "decode_pages": sent - held},
		n.ps: {"prefill_transfer": 1, "prefill": held - 1},
	}
	names := map[*httptest.Server]string{n.rs: "router", n.ds: "decode node", n.ps: "prefill node"}
	waiting := func(srv *httptest.Server) map[string]float64 {
		got := map[string]float64{}
		for _, q := range []string{"routed", "decode_pages", "decode_transfer", "prefill", "prefill_transfer"} {
			if v := metric(t, scrape(t, srv), `kvwarden_requests_waiting{queue="`+q+`"}`); v != 0 {
				got[q] = v
			}
		}
		return got
	}
	testwait.Report(t, "five requests held where they wait", time.Minute, func() (bool, string) {
		saw := ""
		for srv, w := range want {
			if got := waiting(srv); fmt.Sprint(got) != fmt.Sprint(w) {
				saw += fmt.Sprintf("the %s has %v waiting, want %v; ", names[srv], got, w)
			}
		}
		return saw == "", saw
	})
	if d := n.d.Status().Node; d.InFlight != sent || d.Running != 0 {
		t.Errorf("the decode node has %d requests in flight, %d running; want %d, none running", d.InFlight, d.Running, sent)
	}
	release()
	for range sent {
		select {
		case err := <-ended:
			if err == nil {
				t.Error("a request answered without its KV")
			}
		case <-time.After(time.Minute):
			t.Fatal("the held requests did not all end within a minute of the data plane's going")
		}
	}
	testwait.Report(t, "every queue empty", time.Minute, func() (bool, string) {
		saw := ""
		for srv := range want {
			if got := waiting(srv); len(got) > 0 {
				saw += fmt.Sprintf("the %s has %v waiting; ", names[srv], got)
			}
		}
		return saw == "", saw
	})
}

// TestKVTransferMetrics: three requests to a decode node are three
// transfers over the data plane, counted on the prefill node as sent and on
// the decode node as received, each of exactly its prompt's pages and KV
// bytes; the status says the same. Then forged traffic on the decode node's
// data plane, each kind refused by its check and counted once under its
// reason: a frame for a request that is not there, a batch of two requests'
// frames, a frame for another incarnation of the node, a frame whose bytes
// do not match its checksum, and a hello of another model.
func TestKVTransferMetrics(t *testing.T) {
	p, d, ps, ds := startPair(t, nil)
	c := dial(t, d)
	prompts := []string{"one", strings.Repeat("a page and more ", 3), strings.Repeat("z", 47)} // 4, 49 and 48 tokens
	for _, prompt := range prompts {
		if _, err := c.Generate(context.Background(), "acme", prompt, client.GenerateOptions{MaxTokens: 3}, nil); err != nil {
			t.Fatal(err)
		}
	}
	tokens, pages, bytes := kvOf(t, d, prompts...)
	moved := func(side string) map[string]float64 {
		return map[string]float64{`kvwarden_kv_transfer_duration_seconds_count{side="` + side + `"}`: 3,
			`kvwarden_kv_transfer_pages_total{side="` + side + `"}`: pages, `kvwarden_kv_transfer_bytes_total{side="` + side + `"}`: bytes,
			`kvwarden_kv_transfer_failures_total{code="node_lost",side="` + side + `"}`: 0}
	}
	prefill, decode := moved("send"), moved("receive")
	prefill[`kvwarden_kv_transfer_duration_seconds_count{side="receive"}`] = 0
	decode[`kvwarden_kv_transfer_duration_seconds_count{side="send"}`] = 0
	// The prompts were computed on the prefill node only.
	prefill[`kvwarden_prompt_tokens_total`], decode[`kvwarden_prompt_tokens_total`] = tokens, 0
	wantSeries(t, "the prefill node", scrape(t, ps), prefill)
	wantSeries(t, "the decode node", scrape(t, ds), decode)
	want := &messages.TransferStatus{Transfers: 3, Pages: uint64(pages), Bytes: uint64(bytes)}
	if s := p.Status().Node; s.KVSent == nil || fmt.Sprint(*s.KVSent) != fmt.Sprint(*want) || s.KVReceived != nil {
		t.Errorf("prefill status: sent %+v, received %+v; want sent %+v", s.KVSent, s.KVReceived, want)
	}
	if s := d.Status().Node; s.KVReceived == nil || fmt.Sprint(*s.KVReceived) != fmt.Sprint(*want) || s.KVSent != nil {
		t.Errorf("decode status: sent %+v, received %+v; want received %+v", s.KVSent, s.KVReceived, want)
	}

	cfg := d.Actors().Config()
	inc := d.Incarnation()
	forger := dataplane.DefaultLocalConfig(cfg.Geometry(), 7)
	forger.Batch, forger.Auth, forger.Model = cfg.BatchLimits(), trust.Insecure(nil), d.Actors().Model().Fingerprint()
	frame := func(request uint64, dest uint64) kv.Frame {
		return kv.Frame{Owner: kv.Owner{Request: request, Tenant: "acme"}, Dest: kv.Tag{Incarnation: dest, Index: 1, Generation: 1},
			Tokens: 1, Payload: make([]byte, cfg.Geometry().BytesPerToken())}
	}
	send := func(what string, frames ...kv.Frame) {
		s, err := dataplane.Dial(forger, d.DataAddr(), inc, trust.Identity{})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := s.Send(context.Background(), frames); !errors.Is(err, dataplane.ErrRefused) {
			t.Fatalf("%s: %v, want refused", what, err)
		}
	}
	send("a frame for no request here", frame(1<<40, inc))
	send("frames of two requests in one batch", frame(1<<40, inc), frame(1<<41, inc))
	send("a frame for another incarnation", frame(1<<40, inc+2))
	if ack := sendCorrupt(t, d.DataAddr(), forger, inc, frame(1<<40, inc)); ack != 1 {
		t.Fatalf("a frame whose bytes do not match its checksum: acknowledged with status %d, want 1 (malformed)", ack)
	}
	other := forger
	other.Model[0] ^= 1
	if _, err := dataplane.Dial(other, d.DataAddr(), inc, trust.Identity{}); !errors.Is(err, dataplane.ErrRefused) {
		t.Fatalf("a hello of another model: %v, want refused", err)
	}
	refused := map[string]float64{}
	for _, r := range actors.IntegrityReasonNames() {
		refused[`kvwarden_integrity_refusals_total{reason="`+r+`"}`] = 0
	}
	for r, n := range map[string]float64{"stale_tag": 2, "wrong_owner": 1, "checksum": 1, "fingerprint": 1} {
		refused[`kvwarden_integrity_refusals_total{reason="`+r+`"}`] = n
	}
	wantSeries(t, "after five kinds of forged traffic", scrape(t, ds), refused)
}

// sendCorrupt plays the sender's side of the data plane by hand (the hello
// and reply as cluster/dataplane.go lays them out) and sends f in a batch
// whose last payload byte was flipped after its checksum; it returns the
// status of the batch's acknowledgement.
func sendCorrupt(t *testing.T, addr string, cfg dataplane.Config, peer uint64, f kv.Frame) byte {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var hello [64]byte
	le := binary.LittleEndian
	copy(hello[:], "KVH1")
	hello[4] = 2
	le.PutUint64(hello[8:], cfg.Incarnation)
	le.PutUint64(hello[16:], peer)
	le.PutUint32(hello[24:], uint32(cfg.Batch.PagesMax))
	le.PutUint32(hello[28:], uint32(cfg.Batch.Frame.PageTokens))
	le.PutUint32(hello[32:], uint32(cfg.Batch.Frame.BytesPerToken))
	le.PutUint64(hello[40:], uint64(cfg.Batch.BytesMax))
	copy(hello[48:], cfg.Model[:])
	if _, err := conn.Write(hello[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(conn, hello[:]); err != nil || string(hello[:4]) != "KVR1" || hello[5] != 0 {
		t.Fatalf("hello reply %q, %v: want accepted", hello[:8], err)
	}
	batch, err := kv.AppendBatch(nil, []kv.Frame{f}, cfg.Batch)
	if err != nil {
		t.Fatal(err)
	}
	batch[len(batch)-1] ^= 1
	if _, err := conn.Write(batch); err != nil {
		t.Fatal(err)
	}
	var ack [24]byte
	if _, err := io.ReadFull(conn, ack[:]); err != nil {
		t.Fatal(err)
	}
	return ack[8]
}

// blackHole accepts connections and never reads or answers, until release
// closes them.
func blackHole(t *testing.T) (addr string, release func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	release = func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
	t.Cleanup(release)
	return l.Addr().String(), release
}

// TestKVTransferStalledAndFailed: a decode node that advertises a data
// plane that never answers (admitting one request at a time) has its
// request wait for its KV while the prefill node holds the transfer under
// way; a second request meanwhile is refused for the queue. When the data
// plane goes, the transfer fails on both sides, counted once each under
// the code the client is told.
func TestKVTransferStalledAndFailed(t *testing.T) {
	hole, release := blackHole(t)
	_, d, ps, ds := startPair(t, func(cfg *cluster.NodeConfig) {
		if cfg.Actors.Role == actors.RolePrefill {
			// The transfer stays under way until the test lets the data
			// plane go, however long a loaded machine takes to look.
			cfg.DataPlane.DialTimeout = time.Hour
			return
		}
		cfg.DataAdvertise = hole
		cfg.Actors.QueueMax = 1
	})
	c := dial(t, d)
	failed := make(chan error, 1)
	go func() {
		_, err := c.Generate(context.Background(), "acme", "into the black hole", client.GenerateOptions{MaxTokens: 2}, nil)
		failed <- err
	}()
	testwait.For(t, "the transfer under way", time.Minute, func() bool {
		return metric(t, scrape(t, ps), `kvwarden_requests_waiting{queue="prefill_transfer"}`) == 1
	})
	wantSeries(t, "the decode node, its request waiting for its KV", scrape(t, ds), map[string]float64{
		`kvwarden_requests_waiting{queue="decode_transfer"}`: 1, `kvwarden_requests_waiting{queue="decode_pages"}`: 0,
		`kvwarden_requests_running`: 0, `kvwarden_requests_in_flight`: 1})
	_, err := c.Generate(context.Background(), "acme", "one more", client.GenerateOptions{MaxTokens: 2}, nil)
	refusedWith(t, "a second request with one admitted at a time", err, messages.CodeBusy)
	release()
	err = testwait.Recv(t, "the held request's end", time.Minute, failed)
	var we *messages.WireError
	if !errors.As(err, &we) {
		t.Fatalf("the request into the black hole: %v, want a refusal", err)
	}
	code := we.Code.String()
	testwait.For(t, "the prefill node done with the transfer", time.Minute, func() bool {
		return metric(t, scrape(t, ps), `kvwarden_requests_waiting{queue="prefill_transfer"}`) == 0
	})
	wantSeries(t, "the prefill node", scrape(t, ps), map[string]float64{
		`kvwarden_kv_transfer_failures_total{code="` + code + `",side="send"}`: 1,
		`kvwarden_kv_transfer_duration_seconds_count{side="send"}`:             0})
	wantSeries(t, "the decode node", scrape(t, ds), map[string]float64{
		`kvwarden_kv_transfer_failures_total{code="` + code + `",side="receive"}`: 1,
		`kvwarden_kv_transfer_duration_seconds_count{side="receive"}`:             0,
		`kvwarden_requests_waiting{queue="decode_transfer"}`:                      0,
		`kvwarden_admission_rejections_total{bound="queue"}`:                      1,
		`kvwarden_requests_failed_total{code="` + code + `"}`:                     1})
	for _, s := range []struct {
		name   string
		scrape string
		side   string
	}{{"prefill", scrape(t, ps), "send"}, {"decode", scrape(t, ds), "receive"}} {
		total := 0.0
		for _, c := range messages.KnownCodes() {
			total += metric(t, s.scrape, `kvwarden_kv_transfer_failures_total{code="`+c.String()+`",side="`+s.side+`"}`)
		}
		if total != 1 {
			t.Errorf("the %s node counts %g failed transfers, want 1", s.name, total)
		}
	}
}

// TestScrapeParses reads a node's whole scrape with Prometheus' own parser:
// every family once, of its declared type, histograms whole; and a label
// value or help with the characters the format escapes comes back as it
// was.
func TestScrapeParses(t *testing.T) {
	_, srv := startAs(t, actors.RoleAll, nil)
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(scrape(t, srv)))
	if err != nil {
		t.Fatal(err)
	}
	// The parser refuses a family twice; a role-all node with no API has
	// the node's 34 (its tenants held to their shares and its first tokens' phases among them), its
	// prefill pool's prefix cache's 6, the HTTP server's refusals, and the
	// Go runtime's and the process's. A histogram's buckets are the bounds
	// and +Inf.
	own := 0
	for name := range families {
		if strings.HasPrefix(name, "kvwarden_") {
			own++
		}
	}
	hist := families["kvwarden_kv_transfer_duration_seconds"]
	if own != 43 || hist == nil || hist.GetType().String() != "HISTOGRAM" || len(hist.GetMetric()) != 2 ||
		len(hist.GetMetric()[0].GetHistogram().GetBucket()) != len(actors.LatencyBounds())+1 {
		t.Fatalf("%d families of the node's; the transfer durations: %v", own, hist)
	}
	for _, name := range []string{"go_goroutines", "go_info", "go_memstats_heap_alloc_bytes", "go_gc_duration_seconds",
		"process_cpu_seconds_total", "process_resident_memory_bytes", "process_open_fds"} {
		if families[name] == nil {
			t.Errorf("no %s among the %d families", name, len(families))
		}
	}
	info := map[string]string{}
	for _, l := range families["kvwarden_build_info"].GetMetric()[0].GetLabel() {
		info[l.GetName()] = l.GetValue()
	}
	if len(info) != 3 || info["goversion"] != runtime.Version() || info["version"] == "" || info["revision"] == "" {
		t.Errorf("kvwarden_build_info%v, want goversion %s, a version and a revision", info, runtime.Version())
	}
	var e exposition
	odd := "a \\ \" b\nc"
	e.family(family{"x_total", "counter", odd})
	e.sample("x_total", "", 3, "label", odd)
	got, err := p.TextToMetricFamilies(strings.NewReader(string(e.b)))
	if err != nil {
		t.Fatalf("%v in:\n%s", err, e.b)
	}
	x := got["x_total"]
	if x.GetHelp() != odd || x.GetMetric()[0].GetLabel()[0].GetValue() != odd || x.GetMetric()[0].GetCounter().GetValue() != 3 {
		t.Fatalf("written %q, read back %v", odd, x)
	}
}

package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
)

// listed is one row of node requests.
type listed struct{ id, tenant, clientID, phase, decode, prefill string }

// requestsOf runs node requests against endpoint with extra flags and
// returns its rows and its whole output.
func requestsOf(t *testing.T, endpoint string, extra ...string) ([]listed, string) {
	t.Helper()
	code, stdout, stderr := runBinary(t, "", append([]string{"requests", "--endpoint", endpoint}, extra...)...)
	if code != exitOK {
		t.Fatalf("node requests --endpoint %s %v: exit %d; stderr:\n%s", endpoint, extra, code, stderr)
	}
	var rows []listed
	table := false
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) > 0 && f[0] == "ID":
			table = true
		case table && len(f) == 8:
			rows = append(rows, listed{id: f[0], tenant: f[1], clientID: f[2], phase: f[3], decode: f[4], prefill: f[5]})
		}
	}
	return rows, stdout
}

// TestBinaryRequestsCancel: with the prefill node's remote behind a shut
// gate, two requests through the router wait for it. node requests lists
// them on the router (routed to the decode node) and on the decode node
// (waiting for the prefill node), oldest first and no more than --limit;
// node cancel, on either, ends the request's client with "cancelled" and
// frees the decode node's pages; an ID not in flight or of another node is
// refused, naming it; a tenant's credential is refused before anything is
// sent.
func TestBinaryRequestsCancel(t *testing.T) {
	gate := testnet.NewGate(t)
	listen := freeTCPAddr(t)
	gate.Open(listen)
	router := startMember(t, "router", "")
	prefill := startMember(t, "prefill", router.gossip, "--listen", listen, "--advertise", gate.Addr())
	decode := startMember(t, "decode", router.gossip)
	waitConverged(t, router, prefill, decode)
	gate.Shut()

	tenants := []string{"acme", "globex"}
	clients := map[string]*process{}
	for i, tenant := range tenants {
		clients[tenant] = startProcess(t, "generate", "--endpoint", router.addr, "--tenant", tenant,
			"--prompt", "a request held before its prefill node", "--max-tokens", "8")
		// One at a time, so that their ages order them.
		testwait.Report(t, fmt.Sprintf("%d requests waiting for the prefill node", i+1), commandTimeout, func() (bool, string) {
			l, err := testControl(t).inFlight(decode.addr, messages.InFlightListMax, statusPollTimeout)
			if err != nil {
				return false, err.Error()
			}
			return len(l.Requests) == i+1 && l.Requests[i].Phase == messages.PhasePrefill, fmt.Sprintf("%+v", l)
		})
	}

	routed, _ := requestsOf(t, router.addr)
	held, out := requestsOf(t, decode.addr, "--limit", "1")
	if len(routed) != 2 || len(held) != 1 {
		t.Fatalf("listed %d on the router, %d with --limit 1 on the decode node; want 2 and 1:\n%+v\n%s", len(routed), len(held), routed, out)
	}
	for i, r := range routed {
		if r.tenant != tenants[i] || r.phase != messages.PhaseRouted || r.decode != decode.addr || r.prefill != prefill.addr ||
			!strings.HasPrefix(r.id, fmt.Sprintf("%016x-", router.incarnation)) {
			t.Errorf("the router lists %+v, want %s's request routed to %s with prefill node %s", r, tenants[i], decode.addr, prefill.addr)
		}
	}
	if h := held[0]; h.tenant != "acme" || h.phase != messages.PhasePrefill || h.decode != decode.addr || h.prefill != prefill.addr ||
		h.clientID != routed[0].clientID {
		t.Errorf("the decode node lists %+v, want acme's request %s waiting for %s", h, routed[0].clientID, prefill.addr)
	}
	for _, want := range []string{fmt.Sprintf("2 requests in flight on %s (incarnation %016x)", decode.addr, decode.incarnation),
		"1 more in flight, not listed"} {
		if !strings.Contains(out, want) {
			t.Errorf("node requests --limit 1 lacks %q:\n%s", want, out)
		}
	}

	code, _, stderr := runBinary(t, "", "requests", "--endpoint", decode.addr, "--cert", "tenant-acme")
	if code != exitUsage || !strings.Contains(stderr, "this needs a operator's") {
		t.Errorf("node requests with a tenant's certificate: exit %d, want %d; stderr:\n%s", code, exitUsage, stderr)
	}
	unknown := fmt.Sprintf("%016x-999", decode.incarnation)
	for id, want := range map[string]string{unknown: "is not in flight on this node", routed[1].id: "this node is incarnation"} {
		code, _, stderr := runBinary(t, "", "cancel", "--endpoint", decode.addr, id)
		if code != exitFailed || !strings.Contains(stderr, "cancel "+id+" on "+decode.addr) || !strings.Contains(stderr, want) {
			t.Errorf("node cancel %s on the decode node: exit %d, want %d naming the ID and %q; stderr:\n%s", id, code, exitFailed, want, stderr)
		}
	}

	// acme's on the decode node, globex's through the router.
	for _, c := range []struct{ tenant, endpoint, id string }{{"acme", decode.addr, held[0].id}, {"globex", router.addr, routed[1].id}} {
		code, stdout, stderr := runBinary(t, "", "cancel", "--endpoint", c.endpoint, c.id)
		if code != exitOK || !strings.Contains(stdout, "cancelled "+c.id+" on "+c.endpoint+": tenant "+c.tenant) {
			t.Fatalf("node cancel %s on %s: exit %d; stdout:\n%s\nstderr:\n%s", c.id, c.endpoint, code, stdout, stderr)
		}
		p := clients[c.tenant]
		if code := p.exitCode(t, exitTimeout); code != exitFailed || !strings.Contains(p.stderr.String(), "cancelled (5)") {
			t.Errorf("%s's generate: exit %d, want %d with cancelled (5); stderr:\n%s", c.tenant, code, exitFailed, p.stderr)
		}
	}
	testwait.Report(t, "every page of the decode node free", commandTimeout, func() (bool, string) {
		s, err := statusOf(t, decode.addr)
		if err != nil {
			return false, err.Error()
		}
		for _, p := range s.Node.Pools {
			if !p.Idle() {
				return false, fmt.Sprintf("pool %s: %d of %d pages free, %d cached", p.Name, p.Free, p.Capacity, p.CachePages)
			}
		}
		return s.Node.InFlight == 0, fmt.Sprintf("%d in flight", s.Node.InFlight)
	})
	if rows, out := requestsOf(t, decode.addr); len(rows) != 0 || !strings.HasPrefix(out, "0 requests in flight") {
		t.Errorf("after the cancels the decode node lists:\n%s", out)
	}
}

func TestParseRequestID(t *testing.T) {
	id, err := parseInFlightID("3c9e5a2b8f1d0e47-12")
	if err != nil || id != (inFlightID{0x3c9e5a2b8f1d0e47, 12}) || id.String() != "3c9e5a2b8f1d0e47-12" {
		t.Fatalf("parse: %+v, %v", id, err)
	}
	for _, bad := range []string{"", "12", "3c9e5a2b8f1d0e47", "3c9e5a2b8f1d0e47-", "-12", "xyz-12", "3c9e5a2b8f1d0e47-0",
		"0-12", "3c9e5a2b8f1d0e47-1-2", "13c9e5a2b8f1d0e47-12"} {
		if _, err := parseInFlightID(bad); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("%q", bad)) {
			t.Errorf("parse %q: %v, want an error naming it", bad, err)
		}
	}
}

func TestPrintRequests(t *testing.T) {
	l := &messages.InFlightList{Incarnation: 0xab, Omitted: 3, Requests: []messages.InFlight{
		{Number: 4, ClientID: 9, Tenant: "acme", Phase: messages.PhaseDecode, Prefill: "10.0.0.2:1", Decode: "10.0.0.1:1", AgeMs: 61_234, Tokens: 17},
		{Number: 5, ClientID: 2, Tenant: "globex", Phase: messages.PhaseQueued, Decode: "10.0.0.1:1", AgeMs: 250}}}
	var out bytes.Buffer
	printInFlight(&out, "10.0.0.1:1", l)
	want := `5 requests in flight on 10.0.0.1:1 (incarnation 00000000000000ab)
ID                  TENANT  CLIENT ID  PHASE   DECODE      PREFILL     AGE     TOKENS
00000000000000ab-4  acme    9          decode  10.0.0.1:1  10.0.0.2:1  1m1.2s  17
00000000000000ab-5  globex  2          queued  10.0.0.1:1  -           250ms   0
3 more in flight, not listed: the list holds the oldest 2
`
	if got := out.String(); got != want {
		t.Fatalf("printed\n%s\nwant\n%s", got, want)
	}
}

//go:build !race

// The victim node and the client that checks it still serves are two
// protoactor remote instances in one process, which race inside
// protoactor and gRPC; see node_test.go.

package cluster

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/kvwarden/kvwarden/actors"
	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/internal/testnet"
	"github.com/kvwarden/kvwarden/internal/testwait"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
	"github.com/kvwarden/kvwarden/trust/trusttest"
)

// attackTimeout bounds each exchange with the victim; it is only reached
// when something is broken.
const attackTimeout = 10 * time.Second

// attackVictim starts a secure node serving every role under auth, as a
// real deployment's would, logging to log (nil discards).
func attackVictim(t *testing.T, auth *trust.Authority, log *slog.Logger) *Node {
	t.Helper()
	cfg := DefaultLocalNodeConfig(actors.RoleAll)
	cfg.Auth = auth
	n, err := StartNode(withModel(t, cfg), log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Stop() })
	return n
}

// rawHandshake dials addr with a hand-made TLS configuration, as an
// attacker's own client would, and reports how the handshake ended: in
// TLS 1.3 the client finishes first, so the server's verdict on its
// certificate arrives on the first read.
func rawHandshake(t *testing.T, addr string, cfg *tls.Config) error {
	t.Helper()
	cfg.InsecureSkipVerify, cfg.MinVersion, cfg.NextProtos = true, tls.VersionTLS13, []string{"h2"}
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(attackTimeout))
	var b [1]byte
	_, err = conn.Read(b[:])
	return err
}

// remotingClient is a hand-written protoactor remote client over mutual
// TLS with b's certificate: it speaks the wire protocol directly, with
// none of protoactor's own checks.
func remotingClient(t *testing.T, addr string, b *trust.Bundle) remote.RemotingClient {
	t.Helper()
	cc, err := grpc.Dial(addr, grpc.WithTransportCredentials(credentials.NewTLS(b.ClientTLS())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return remote.NewRemotingClient(cc)
}

func connectMsg(addr string) *remote.RemoteMessage {
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_ConnectRequest{ConnectRequest: &remote.ConnectRequest{
		ConnectionType: &remote.ConnectRequest_ServerConnection{ServerConnection: &remote.ServerConnection{
			SystemId: "attacker", Address: addr}}}}}
}

func batchMsg(b *remote.MessageBatch) *remote.RemoteMessage {
	return &remote.RemoteMessage{MessageType: &remote.RemoteMessage_MessageBatch{MessageBatch: b}}
}

// play opens a stream, sends msgs in order and returns how the victim
// ended the stream; it fails the test if the victim answers anything but
// the connect response or keeps the stream open.
func play(t *testing.T, rc remote.RemotingClient, msgs ...*remote.RemoteMessage) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), attackTimeout)
	defer cancel()
	stream, err := rc.Receive(ctx)
	if err != nil {
		t.Fatalf("opening a stream: %v", err)
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			break // the victim closed the stream already; Recv says why
		}
	}
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		if m.GetConnectResponse() == nil {
			t.Fatalf("the victim answered %T", m.MessageType)
		}
	}
}

// refusedWith checks that err is the guard's refusal saying why.
func refusedWith(t *testing.T, what string, err error, why string) {
	t.Helper()
	if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), why) {
		t.Fatalf("%s: stream ended with %v, want PermissionDenied saying %q", what, err, why)
	}
}

func generate(t *testing.T, addr string, tenant *trust.Authority) client.Result {
	t.Helper()
	c, err := client.Dial(addr, client.Options{Auth: tenant, NoAnswerAfter: attackTimeout})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), attackTimeout)
	defer cancel()
	res, err := c.Generate(ctx, tenant.Self().Name, "the attack suite", client.GenerateOptions{MaxTokens: 8}, nil)
	if err != nil {
		t.Fatalf("Generate: %v", err)
	}
	return res
}

// Raw attacks on a node's protoactor remote port, each refused, counted
// by kind and survived: one malformed batch would otherwise panic
// protoactor's endpoint reader and kill the process, and a system message
// such as PoisonPill would stop the actor it names.
func TestAttackRemote(t *testing.T) {
	ca := trusttest.New(t)
	victim := attackVictim(t, ca.Authority(t, trust.RoleAll, "victim", nil), nil)
	addr, auth := victim.Address(), victim.cfg.Auth
	tenant := ca.Authority(t, trust.RoleTenant, "acme", nil)
	before := generate(t, addr, tenant)
	base := auth.Refused()
	want := base

	// (a) No client certificate, (b) a foreign CA's: the handshake fails.
	if err := rawHandshake(t, addr, &tls.Config{}); err == nil {
		t.Fatal("a handshake without a client certificate was accepted")
	}
	foreign := trusttest.New(t).Bundle(t, trust.RoleTenant, "acme")
	if err := rawHandshake(t, addr, &tls.Config{Certificates: []tls.Certificate{foreign.Cert}}); err == nil {
		t.Fatal("a handshake with a foreign CA's certificate was accepted")
	}
	want[trust.RefusedCertificate] += 2

	// (c) A valid certificate claiming another node's address.
	rc := remotingClient(t, addr, tenant.Bundle())
	other := trusttest.ServeTLS(t, ca.Bundle(t, trust.RoleDecode, "d1"))
	refusedWith(t, "connect as another node", play(t, rc, connectMsg(other)), "not proven")
	want[trust.RefusedAddress]++

	// (d) Malformed batches, each after an honest connect request from an
	// address the attacker does serve (but the first).
	own := trusttest.ServeTLS(t, tenant.Bundle())
	here := &actor.PID{Address: addr, Id: actors.AdmissionName}
	envelope := messages.EnvelopeTypeName
	batches := []struct {
		what, why string
		batch     *remote.MessageBatch
		connect   bool
	}{
		{"batch before connect", "batch before connect request",
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{here},
				Envelopes: []*remote.MessageEnvelope{{}}}, false},
		{"target index out of range", "target index 7 of 1",
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{here},
				Envelopes: []*remote.MessageEnvelope{{Target: 7}}}, true},
		{"type index out of range", "type index 3 of 1",
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{here},
				Envelopes: []*remote.MessageEnvelope{{TypeId: 3}}}, true},
		{"a system message", `type "actor.PoisonPill" not allowed`,
			&remote.MessageBatch{TypeNames: []string{"actor.PoisonPill"}, Targets: []*actor.PID{here},
				Envelopes: []*remote.MessageEnvelope{{}}}, true},
		{"a target elsewhere", `target 0 is at "127.0.0.1:1", not here`,
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{{Address: "127.0.0.1:1", Id: "x"}},
				Envelopes: []*remote.MessageEnvelope{{}}}, true},
		{"an endpoint writer", `target 0 ("EndpointSupervisor/$4") is not an actor peers may address`,
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{{Address: addr, Id: "EndpointSupervisor/$4"}},
				Envelopes: []*remote.MessageEnvelope{{}}}, true},
		{"a future", `target 0 ("future$3") is not an actor peers may address`,
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{{Address: addr, Id: "future$3"}},
				Envelopes: []*remote.MessageEnvelope{{}}}, true},
		{"an unnamed actor", `target 0 ("$1") is not an actor peers may address`,
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{{Address: addr, Id: "$1"}},
				Envelopes: []*remote.MessageEnvelope{{}}}, true},
		{"a sender at another address", `sender 0 is at "` + addr + `"`,
			&remote.MessageBatch{TypeNames: []string{envelope}, Targets: []*actor.PID{here},
				Senders: []*actor.PID{{Address: addr, Id: "admission"}}, Envelopes: []*remote.MessageEnvelope{{Sender: 1}}}, true},
	}
	for _, b := range batches {
		msgs := []*remote.RemoteMessage{batchMsg(b.batch)}
		if b.connect {
			msgs = slices.Insert(msgs, 0, connectMsg(own))
		}
		refusedWith(t, b.what, play(t, rc, msgs...), b.why)
		want[trust.RefusedBatch]++
	}

	// (e) A unary call: protoactor's ListProcesses panics.
	ctx, cancel := context.WithTimeout(context.Background(), attackTimeout)
	defer cancel()
	_, err := rc.ListProcesses(ctx, &remote.ListProcessesRequest{})
	if status.Code(err) != codes.PermissionDenied {
		t.Fatalf("ListProcesses = %v, want PermissionDenied", err)
	}
	want[trust.RefusedBatch]++

	if got := auth.Refused(); got != want {
		t.Fatalf("refusals %v, want %v (names %v)", got, want, trust.RefusalNames())
	}
	// The node still serves, and answers as before.
	after := generate(t, addr, tenant)
	if !slices.Equal(after.Tokens, before.Tokens) || after.Text != before.Text {
		t.Fatalf("after the attacks the node answered %q %v, before %q %v", after.Text, after.Tokens, before.Text, before.Tokens)
	}
	if got := auth.Refused(); got != want {
		t.Fatalf("an honest request after the attacks was refused: %v, want %v", got, want)
	}
	if err := victimAlive(victim); err != nil {
		t.Fatal(err)
	}
}

// victimAlive says whether the node's admission actor still runs: a
// PoisonPill let through would have stopped it.
func victimAlive(n *Node) error {
	if _, err := n.actors.Status(); err != nil {
		return errors.Join(errors.New("the victim's admission no longer answers"), err)
	}
	return nil
}

// hostileClaims opens n protoactor streams with b's certificate, each
// claiming the address claim, over as many connections as the victim's
// StreamsPerConnMax needs, and returns how each ended, on a channel
// closed when all have.
func hostileClaims(t *testing.T, addr string, b *trust.Bundle, n int, claim string) <-chan error {
	t.Helper()
	ended := make(chan error, n)
	perConn := int(trust.DefaultConfig().StreamsPerConnMax)
	var rc remote.RemotingClient
	done := make(chan struct{}, n)
	for i := range n {
		if i%perConn == 0 {
			rc = remotingClient(t, addr, b)
		}
		go func(rc remote.RemotingClient) {
			defer func() { done <- struct{}{} }()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			stream, err := rc.Receive(ctx)
			if err == nil {
				err = stream.Send(connectMsg(claim))
			}
			for err == nil {
				var m *remote.RemoteMessage
				if m, err = stream.Recv(); err == nil && m.GetConnectResponse() != nil {
					err = errors.New("the victim accepted a claim no one proved")
				}
			}
			ended <- err
		}(rc)
	}
	go func() {
		for range n {
			<-done
		}
		close(ended)
	}()
	return ended
}

// Attack 3: a tenant opens many protoactor streams claiming an address
// that accepts TCP and never answers. Its claims take only its own share
// of the victim's claim probes (ClaimProbesPerIdentityMax), the rest are
// refused by that bound while its probes hang, another tenant's request
// is served meanwhile, and once the probes have failed the same claim is
// refused from memory without a probe. Every refusal is counted by bound
// and the victim's log stays a few lines a second.
func TestAttackClaimProbes(t *testing.T) {
	ca := trusttest.New(t)
	cfg := trust.DefaultConfig()
	// The hostile probes hang until the test releases them, and their
	// failure is remembered for the rest of the test.
	cfg.DialTimeout, cfg.ClaimFailureTTL = time.Minute, time.Hour
	var logged testwait.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	auth, err := trust.New(ca.Bundle(t, trust.RoleAll, "victim"), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	victim := attackVictim(t, auth, log)
	addr := victim.Address()
	hang := testnet.NewSilent(t)
	mallory := ca.Bundle(t, trust.RoleTenant, "mallory")
	acme := ca.Authority(t, trust.RoleTenant, "acme", nil)
	const victimRequests = 5
	served := func() time.Duration {
		start := time.Now()
		for range victimRequests {
			if res := generate(t, addr, acme); len(res.Tokens) == 0 {
				t.Fatalf("another tenant's request: %+v", res)
			}
		}
		return time.Since(start)
	}
	alone := served()
	start := time.Now()

	const streams = 48
	ended := hostileClaims(t, addr, mallory, streams, hang.Addr())
	testwait.Report(t, "the hostile tenant's probes under way", time.Minute, func() (bool, string) {
		return hang.Accepted() == cfg.ClaimProbesPerIdentityMax, fmt.Sprintf("%d probes", hang.Accepted())
	})
	attacked := served() // while the hostile probes hang
	limited := uint64(streams - cfg.ClaimProbesPerIdentityMax)
	testwait.Report(t, "the hostile claims past its share refused", time.Minute, func() (bool, string) {
		got := auth.Refused()
		return got[trust.RefusedClaimPeer] == limited, fmt.Sprintf("refusals %v", got)
	})
	hang.Release()
	for err := range ended {
		refusedWith(t, "a hostile claim", err, "not proven")
	}
	const again = 8
	for err := range hostileClaims(t, addr, mallory, again, hang.Addr()) {
		refusedWith(t, "a hostile claim made again", err, "not proven")
	}
	took := time.Since(start)

	got := auth.Refused()
	want := trust.Refusals{}
	want[trust.RefusedAddress] = uint64(cfg.ClaimProbesPerIdentityMax)
	want[trust.RefusedClaimPeer] = limited
	want[trust.RefusedClaimRemembered] = again
	if got != want {
		t.Fatalf("refusals %v, want %v (names %v)", got, want, trust.RefusalNames())
	}
	if n := hang.Accepted(); n != cfg.ClaimProbesPerIdentityMax {
		t.Fatalf("%d probes reached the claimed address, want %d", n, cfg.ClaimProbesPerIdentityMax)
	}
	// Three kinds of refusal, each a burst and then a few lines a second.
	lines := strings.Count(logged.String(), "level=WARN")
	most := 3 * (cfg.RefusalLinesPerSecond + int(math.Ceil(took.Seconds()*float64(cfg.RefusalLinesPerSecond))))
	if lines > most {
		t.Fatalf("%d warnings in %s for %d refusals, want at most %d:\n%s", lines, took, got.Total(), most, logged.String())
	}
	t.Logf("%d warnings (%d bytes, %.0f a minute) in %s for %d refusals; %d requests of another tenant took %s alone, %s under attack (goodput ratio %.2f)",
		lines, len(logged.String()), float64(len(logged.String()))/took.Minutes(), took, got.Total(), victimRequests, alone, attacked,
		alone.Seconds()/attacked.Seconds())
	served()
	if err := victimAlive(victim); err != nil {
		t.Fatal(err)
	}
}

package trust

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// RemotePolicy is what the remote boundary lets in.
type RemotePolicy struct {
	// Self is this process's protoactor address: every target must be
	// here (a peer must not make the node relay to a third party).
	Self string
	// Types are the protobuf type names a batch may carry.
	Types []string
	// RecvBytesMax bounds one gRPC message, in bytes.
	RecvBytesMax int
	// Futures lets replies reach this process's futures (protoactor's
	// "future$N", guessable): only for a process that waits on answers
	// from other processes that way (operators' commands). Nodes and
	// clients answer and are answered actor to actor.
	Futures bool
	// Incarnation is the run of the node this remote serves, which it
	// answers a node's run challenge with (RunProto, AskRun); 0 for a
	// process that is no node's run (a client, an operator's command),
	// whose remote serves no run challenge.
	Incarnation uint64
}

// targetAllowed says whether a peer may address the actor id: none of
// protoactor's own (unnamed "$N" actors and children, the endpoint
// supervisor and its writers, the activator), and futures only where the
// policy lets them in. Reaching those would let any peer kill an endpoint
// writer (dropping what it queued) or complete a local future with its own
// message.
func (pol RemotePolicy) targetAllowed(id string) bool {
	switch {
	case strings.HasPrefix(id, "future$"):
		return pol.Futures
	case strings.Contains(id, "$"), id == "activator", id == "EndpointSupervisor",
		strings.HasPrefix(id, "EndpointSupervisor/"):
		return false
	}
	return id != ""
}

// DeadLetterResponseType is protoactor's answer from a node to a request
// for an actor that does not exist there: it fails the asker's future at
// once, and carries nothing an attacker could use.
const DeadLetterResponseType = "actor.DeadLetterResponse"

// ServerOptions are the gRPC server options of protoactor remote under
// this authority: TLS with client certificates (unless insecure), the
// stream guard, no unary calls (protoactor's are unimplemented and panic),
// and the receive limits.
func (a *Authority) ServerOptions(pol RemotePolicy) []grpc.ServerOption {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(pol.RecvBytesMax),
		grpc.MaxConcurrentStreams(a.cfg.StreamsPerConnMax),
		grpc.ConnectionTimeout(a.cfg.DialTimeout),
		grpc.ChainStreamInterceptor(a.guardStream(pol)),
		grpc.ChainUnaryInterceptor(a.refuseUnary),
	}
	if a.bundle != nil {
		cfg := a.bundle.ServerTLS()
		if pol.Incarnation != 0 {
			cfg.NextProtos = []string{RunProto} // credentials.NewTLS adds gRPC's "h2"
		}
		opts = append(opts, grpc.Creds(&countingCreds{TransportCredentials: credentials.NewTLS(cfg), a: a, run: pol.Incarnation}))
	}
	return opts
}

// countingCreds is the server side's TLS, counting every handshake that
// fails (garbage, plaintext, no certificate, another CA's, expired): gRPC
// completes handshakes before any interceptor runs, so they would go
// uncounted otherwise.
//
// It also answers the run challenge: a connection that negotiated RunProto
// is answered with the run's incarnation and closed here, and gRPC, told
// the connection was dispatched, leaves it alone.
type countingCreds struct {
	credentials.TransportCredentials
	a   *Authority
	run uint64 // RemotePolicy.Incarnation
}

// Before the handshake the connection is a stranger's: it waits within
// the RemoteHandshakes bounds, and one of the cluster's own identities
// that completes it proves its address (Proven).
func (c *countingCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if !c.a.admitStranger(raw) {
		raw.Close()
		return nil, nil, errStrangersFull
	}
	defer c.a.strangerDone(raw)
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if ti, ok := info.(credentials.TLSInfo); err == nil && ok && c.run != 0 && ti.State.NegotiatedProtocol == RunProto {
		c.a.answerRun(conn, ti.State, c.run)
		return nil, nil, credentials.ErrConnDispatched
	}
	// A connection closed before its first byte (a reachability check, a
	// port scan's connect) refused nothing.
	if err != nil && !errors.Is(err, io.EOF) {
		c.a.Refuse(RefusedCertificate, "remote TLS handshake", "peer", raw.RemoteAddr().String(), "err", err)
	}
	if ti, ok := info.(credentials.TLSInfo); ok && err == nil {
		if id, _, err := c.a.bundle.PeerIdentity(ti.State, x509.ExtKeyUsageClientAuth); err == nil && id.Role.IsCluster() {
			c.a.Proven(raw.RemoteAddr().String())
		}
	}
	return conn, info, err
}

// errStrangersFull ends a connection refused before its TLS handshake;
// gRPC only logs it.
var errStrangersFull = errors.New("trust: too many remote connections before their TLS handshake")

func (c *countingCreds) Clone() credentials.TransportCredentials {
	return &countingCreds{TransportCredentials: c.TransportCredentials.Clone(), a: c.a, run: c.run}
}

// DialOptions are the gRPC dial options of protoactor remote: TLS with
// this process's certificate, recording who answered at each address.
func (a *Authority) DialOptions() []grpc.DialOption {
	if a.bundle == nil {
		return []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
	}
	return []grpc.DialOption{grpc.WithTransportCredentials(&recordingCreds{
		TransportCredentials: credentials.NewTLS(a.bundle.ClientTLS()), a: a})}
}

// recordingCreds is TLS that writes into the address book which identity
// answered at the address dialed.
type recordingCreds struct {
	credentials.TransportCredentials
	a *Authority
}

func (c *recordingCreds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ClientHandshake(ctx, authority, raw)
	if err != nil {
		return nil, nil, err
	}
	ti, ok := info.(credentials.TLSInfo)
	if !ok {
		conn.Close()
		return nil, nil, fmt.Errorf("trust: handshake with %s gave %T, not TLS", authority, info)
	}
	id, cert, err := c.a.bundle.PeerIdentity(ti.State, x509.ExtKeyUsageServerAuth)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	if !c.a.peers.record(authority, id, cert) {
		conn.Close()
		return nil, nil, ErrBookFull
	}
	return conn, info, nil
}

func (c *recordingCreds) Clone() credentials.TransportCredentials {
	return &recordingCreds{TransportCredentials: c.TransportCredentials.Clone(), a: c.a}
}

func (a *Authority) refuseUnary(ctx context.Context, _ any, info *grpc.UnaryServerInfo, _ grpc.UnaryHandler) (any, error) {
	a.Refuse(RefusedBatch, "unary call", "method", info.FullMethod, "peer", peerAddr(ctx))
	return nil, status.Error(codes.PermissionDenied, "kvwarden: no unary calls")
}

func peerAddr(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		return p.Addr.String()
	}
	return "?"
}

// guardStream checks every message of a protoactor stream before the
// endpoint reader sees it, and recovers a panic in the reader (which
// trusts indexes from the wire) so that no peer can kill the process.
func (a *Authority) guardStream(pol RemotePolicy) grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) (err error) {
		g := &guardedStream{ServerStream: ss, a: a, pol: pol, from: peerAddr(ss.Context())}
		defer func() {
			if r := recover(); r != nil {
				a.Refuse(RefusedPanic, "panic on a peer's stream", "peer", g.from, "panic", fmt.Sprint(r))
				err = status.Error(codes.Internal, "kvwarden: stream refused")
			}
		}()
		if a.bundle != nil {
			p, _ := peer.FromContext(ss.Context())
			ti, ok := p.AuthInfo.(credentials.TLSInfo)
			if !ok {
				a.Refuse(RefusedCertificate, "stream without TLS", "peer", g.from)
				return status.Error(codes.Unauthenticated, "kvwarden: TLS required")
			}
			if g.id, g.cert, err = a.bundle.PeerIdentity(ti.State, x509.ExtKeyUsageClientAuth); err != nil {
				a.Refuse(RefusedCertificate, "stream certificate", "peer", g.from, "err", err)
				return status.Error(codes.Unauthenticated, err.Error())
			}
		}
		defer func() {
			if g.pinned {
				a.peers.unpin(g.addr)
			}
		}()
		return handler(srv, g)
	}
}

// guardedStream is one peer's inbound protoactor stream.
type guardedStream struct {
	grpc.ServerStream
	a      *Authority
	pol    RemotePolicy
	from   string // the connection's remote address, for logs
	id     Identity
	cert   *x509.Certificate
	addr   string // the protoactor address the peer connected as, checked
	pinned bool   // addr's entry in the address book is held for this stream
}

func (g *guardedStream) RecvMsg(m any) error {
	if err := g.ServerStream.RecvMsg(m); err != nil {
		return err
	}
	rm, ok := m.(*remote.RemoteMessage)
	if !ok {
		return g.refuse(RefusedBatch, fmt.Sprintf("message of type %T", m))
	}
	switch t := rm.MessageType.(type) {
	case *remote.RemoteMessage_ConnectRequest:
		return g.connect(t.ConnectRequest)
	case *remote.RemoteMessage_MessageBatch:
		if g.addr == "" {
			return g.refuse(RefusedBatch, "batch before connect request")
		}
		if why := g.checkBatch(t.MessageBatch); why != "" {
			return g.refuse(RefusedBatch, why)
		}
		return nil
	}
	return g.refuse(RefusedBatch, fmt.Sprintf("remote message %T", rm.MessageType))
}

// connect binds the stream to the protoactor address the peer claims,
// once: the certificate the peer presented must be the one that answers
// at that address.
func (g *guardedStream) connect(c *remote.ConnectRequest) error {
	sc := c.GetServerConnection()
	switch {
	case sc == nil:
		return g.refuse(RefusedBatch, "connect request without a server connection")
	case g.addr != "":
		return g.refuse(RefusedBatch, "second connect request")
	}
	if _, _, err := net.SplitHostPort(sc.Address); err != nil {
		return g.refuse(RefusedBatch, fmt.Sprintf("connect address %q: %v", sc.Address, err))
	}
	if g.a.bundle != nil {
		if err := g.a.peers.Verify(g.from, sc.Address, g.id, g.cert); err != nil {
			// The peer learns only that its claim failed: the reason
			// (what answered where, or how the dial failed) would make the
			// node a port scanner for anyone with a certificate.
			r := RefusedAddress
			var ae *AddressError
			if errors.As(err, &ae) {
				r = ae.Refusal()
			}
			g.a.Refuse(r, "remote stream", "peer", g.from, "identity", g.id.String(), "why", err.Error())
			return status.Error(codes.PermissionDenied, "kvwarden: connect address "+sc.Address+" not proven")
		}
	}
	if g.a.bundle != nil {
		if !g.a.peers.pin(sc.Address) {
			return g.refuse(RefusedAddress, "connect address "+sc.Address+" forgotten as it was proven")
		}
		g.pinned = true
	}
	g.addr = sc.Address
	return nil
}

// checkBatch says what is wrong with a batch, or "".
func (g *guardedStream) checkBatch(b *remote.MessageBatch) string {
	for _, t := range b.TypeNames {
		if !slices.Contains(g.pol.Types, t) {
			return fmt.Sprintf("type %q not allowed", t)
		}
	}
	for i, p := range b.Targets {
		if p == nil || p.Address != g.pol.Self {
			return fmt.Sprintf("target %d is at %q, not here (%s)", i, p.GetAddress(), g.pol.Self)
		}
		if p.Id != AnonymousSender && !g.pol.targetAllowed(p.Id) {
			return fmt.Sprintf("target %d (%q) is not an actor peers may address", i, p.Id)
		}
	}
	for i, p := range b.Senders {
		if p == nil || p.Address != g.addr {
			return fmt.Sprintf("sender %d is at %q, the peer connected as %s", i, p.GetAddress(), g.addr)
		}
	}
	for i, e := range b.Envelopes {
		switch {
		case e == nil:
			return fmt.Sprintf("envelope %d is empty", i)
		case e.TypeId < 0 || int(e.TypeId) >= len(b.TypeNames):
			return fmt.Sprintf("envelope %d: type index %d of %d", i, e.TypeId, len(b.TypeNames))
		case e.Target < 0 || int(e.Target) >= len(b.Targets):
			return fmt.Sprintf("envelope %d: target index %d of %d", i, e.Target, len(b.Targets))
		case e.Sender < 0 || int(e.Sender) > len(b.Senders):
			return fmt.Sprintf("envelope %d: sender index %d of 0 to %d", i, e.Sender, len(b.Senders))
		case e.SerializerId != 0:
			return fmt.Sprintf("envelope %d: serializer %d, want 0", i, e.SerializerId)
		}
	}
	// A reply to a message this process sent without a sender names the
	// anonymous sender the peer gave it: nothing answers there, and it is
	// dropped here rather than refused with the whole stream.
	b.Envelopes = slices.DeleteFunc(b.Envelopes, func(e *remote.MessageEnvelope) bool {
		return b.Targets[e.Target].Id == AnonymousSender
	})
	g.nameSenders(b)
	return ""
}

// AnonymousSender is the actor id the guard gives a message that came
// without a sender (protoactor's Respond sends none): a PID at the peer's
// checked address, so that the receiver still knows who sent it. Nothing
// answers at it; the peer's guard drops a reply to it.
const AnonymousSender = "$anonymous"

// nameSenders gives every envelope without a sender the peer's anonymous
// sender, so that no remote message reaches an actor without one (which
// Authority.SenderOf takes for local).
func (g *guardedStream) nameSenders(b *remote.MessageBatch) {
	anon := int32(0)
	for _, e := range b.Envelopes {
		if e.Sender != 0 {
			continue
		}
		if anon == 0 {
			b.Senders = append(b.Senders, &actor.PID{Address: g.addr, Id: AnonymousSender})
			anon = int32(len(b.Senders))
		}
		e.Sender = anon
	}
}

func (g *guardedStream) refuse(r Refusal, why string) error {
	g.a.Refuse(r, "remote stream", "peer", g.from, "identity", g.id.String(), "why", why)
	return status.Error(codes.PermissionDenied, "kvwarden: "+why)
}

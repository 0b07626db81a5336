package trust

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"time"
)

// The run challenge. A node's certificate names the node (decode/0), not
// the run: every run of decode/0 holds the same one, so a TLS handshake at
// an address proves which node serves there, never which run. A node that
// must know the run (membership verifying a member that gossip announces
// with an incarnation) dials the member's remote address offering only the
// ALPN protocol RunProto, sends a nonce, and reads back the nonce and the
// incarnation of the run that serves there. The answer comes inside a
// mutually authenticated TLS connection that the asker opened, from the
// holder of the certificate's key, and names the nonce just sent: nobody
// else can give it, and no earlier answer can be replayed.
//
// The node's remote (ServerOptions with RemotePolicy.Incarnation) offers
// RunProto beside gRPC's "h2"; a connection that negotiates it is answered
// in the handshake and closed, and never reaches gRPC.

// RunProto is the ALPN protocol of the run challenge. Its version is in
// its name and in the first byte of the challenge and of the answer; a
// build that does not serve it fails the handshake (no protocol in
// common), which an asker reports as no answer.
const RunProto = "kvwarden-run/1"

// RunVersion is the only run challenge encoding this build writes and
// reads.
const RunVersion uint8 = 1

// RunNonceBytes is the size of a challenge's nonce.
const RunNonceBytes = 16

// Layout, fixed sizes, nothing after:
//
//	challenge: version (1) | nonce (RunNonceBytes)
//	answer:    version (1) | nonce (RunNonceBytes) | incarnation (8, little-endian, non-zero)
const (
	runChallengeBytes = 1 + RunNonceBytes
	runAnswerBytes    = 1 + RunNonceBytes + 8
)

// RunAnswerError is an answer to the run challenge that this build does
// not take: of another Version, not naming the nonce sent, or with no
// incarnation.
type RunAnswerError struct {
	Addr               string
	Version, Supported uint8
	Reason             string
}

func (e *RunAnswerError) Error() string {
	return fmt.Sprintf("trust: run challenge at %s answered with version %d (this build reads %d): %s",
		e.Addr, e.Version, e.Supported, e.Reason)
}

// RunProtocolError is a server at Addr that completed the handshake but
// does not serve the run challenge: it negotiated Negotiated ("" for
// none), not RunProto. A data plane, a foreign TLS server or a build
// older than the challenge answers so.
type RunProtocolError struct {
	Addr, Negotiated string
}

func (e *RunProtocolError) Error() string {
	return fmt.Sprintf("trust: %s does not serve the run challenge %s (negotiated %q)", e.Addr, RunProto, e.Negotiated)
}

// AskRun asks the node serving protoactor remote at addr which run it is,
// within the authority's DialTimeout (or until ctx is done): it returns
// the identity proven in the handshake and the incarnation answered. When
// the handshake completed but the challenge failed, the identity is
// returned with the error, so that a certificate of the wrong identity is
// told apart from a server that does not answer.
func (a *Authority) AskRun(ctx context.Context, addr string) (Identity, uint64, error) {
	if a.bundle == nil {
		return Identity{}, 0, fmt.Errorf("trust: run challenge to %s: an insecure authority proves nothing", addr)
	}
	ctx, cancel := context.WithTimeout(ctx, a.cfg.DialTimeout)
	defer cancel()
	cfg := a.bundle.ClientTLS()
	cfg.NextProtos = []string{RunProto}
	c, err := (&tls.Dialer{Config: cfg}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return Identity{}, 0, err
	}
	conn := c.(*tls.Conn)
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	cs := conn.ConnectionState()
	id, _, err := a.bundle.PeerIdentity(cs, x509.ExtKeyUsageServerAuth)
	if err != nil {
		return Identity{}, 0, err
	}
	if cs.NegotiatedProtocol != RunProto {
		return id, 0, &RunProtocolError{Addr: addr, Negotiated: cs.NegotiatedProtocol}
	}
	var q [runChallengeBytes]byte
	q[0] = RunVersion
	rand.Read(q[1:])
	if _, err := conn.Write(q[:]); err != nil {
		return id, 0, fmt.Errorf("trust: run challenge to %s not sent: %w", addr, err)
	}
	var ans [runAnswerBytes]byte
	if _, err := io.ReadFull(conn, ans[:]); err != nil {
		return id, 0, fmt.Errorf("trust: run challenge to %s not answered: %w", addr, err)
	}
	bad := func(reason string) error {
		return &RunAnswerError{Addr: addr, Version: ans[0], Supported: RunVersion, Reason: reason}
	}
	inc := binary.LittleEndian.Uint64(ans[1+RunNonceBytes:])
	switch {
	case ans[0] != RunVersion:
		return id, 0, bad("another version")
	case !bytes.Equal(ans[1:1+RunNonceBytes], q[1:]):
		return id, 0, bad("not the nonce sent")
	case inc == 0:
		return id, 0, bad("incarnation 0, which no run has")
	}
	return id, inc, nil
}

// answerRun answers the run challenge on conn, whose server-side handshake
// (cs) negotiated RunProto, with incarnation, and closes it. The asker
// must hold a node's certificate: the run challenge is how members verify
// one another, and no client or operator needs it. The connection's
// deadline bounds the read: the one gRPC set for the handshake
// (ConnectionTimeout, the authority's DialTimeout).
func (a *Authority) answerRun(conn net.Conn, cs tls.ConnectionState, incarnation uint64) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(a.cfg.DialTimeout))
	id, _, err := a.bundle.PeerIdentity(cs, x509.ExtKeyUsageClientAuth)
	if err != nil {
		a.Refuse(RefusedCertificate, "run challenge certificate", "peer", conn.RemoteAddr().String(), "err", err)
		return
	}
	if !id.Role.IsNode() {
		a.Refuse(RefusedRole, "run challenge from a role that is not a node's", "peer", conn.RemoteAddr().String(),
			"identity", id.String())
		return
	}
	var q [runChallengeBytes]byte
	if _, err := io.ReadFull(conn, q[:]); err != nil {
		return // the asker gave up or timed out: nothing was asked
	}
	// An asker of another version is told this one, and reports it.
	var ans [runAnswerBytes]byte
	ans[0] = RunVersion
	copy(ans[1:], q[1:])
	binary.LittleEndian.PutUint64(ans[1+RunNonceBytes:], incarnation)
	conn.Write(ans[:])
}

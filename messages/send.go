package messages

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/trust"
)

// Send, RequestFuture and Respond validate before handing m to protoactor.
// protoactor does not serialize a message to a local actor, so without
// them an invalid message would pass when the target is local and vanish
// (logged by the endpoint writer) when it is remote. Validate's limits
// guarantee that the frame fits MessageBytesMax.

// Send validates m and sends it to pid without a sender.
func Send(s actor.SenderContext, pid *actor.PID, m Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	s.Send(pid, m)
	return nil
}

// SendFrom validates m and sends it to pid with the current actor as its
// sender, so that pid can answer or name the sender.
func SendFrom(ctx actor.Context, pid *actor.PID, m Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	ctx.Request(pid, m)
	return nil
}

// RequestFuture validates m and sends it to pid with a future that times
// out after timeout.
func RequestFuture(s actor.SenderContext, pid *actor.PID, m Message, timeout time.Duration) (*actor.Future, error) {
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return s.RequestFuture(pid, m, timeout), nil
}

// Request is RequestFuture and a wait for the reply, which must be a
// Message. An *Undecodable reply comes back as its error. It blocks: use
// it from clients and tests, not from inside Receive.
func Request(s actor.SenderContext, pid *actor.PID, m Message, timeout time.Duration) (Message, error) {
	f, err := RequestFuture(s, pid, m, timeout)
	if err != nil {
		return nil, err
	}
	res, err := f.Result()
	if err != nil {
		return nil, err
	}
	switch r := res.(type) {
	case Message:
		return r, nil
	case *Undecodable:
		return nil, r
	}
	return nil, fmt.Errorf("messages: reply to %s is %T, not a message", m.TypeCode(), res)
}

// Respond validates m and sends it to the sender of the current message.
func Respond(ctx actor.Context, m Message) error {
	if err := m.Validate(); err != nil {
		return err
	}
	ctx.Respond(m)
	return nil
}

// remoteOptions are the protoactor remote settings this package's limits
// and auth need: batches of at most RemoteBatchMessagesMax messages, a
// gRPC receive limit of RemoteRecvBytesMax (so that a batch of
// maximum-size messages is never refused, which would close the stream),
// and auth's TLS and stream guard, which lets in only this package's
// envelope (and protoactor's dead-letter answer) for actors at self; a
// node's run (incarnation, non-zero) answers the run challenge.
func remoteOptions(auth *trust.Authority, self string, futures bool, incarnation uint64) []remote.ConfigOption {
	pol := trust.RemotePolicy{Self: self, Types: []string{EnvelopeTypeName, trust.DeadLetterResponseType},
		RecvBytesMax: RemoteRecvBytesMax, Futures: futures, Incarnation: incarnation}
	return []remote.ConfigOption{
		remote.WithEndpointWriterBatchSize(RemoteBatchMessagesMax),
		remote.WithServerOptions(auth.ServerOptions(pol)...),
		remote.WithDialOptions(auth.DialOptions()...),
	}
}

// NewActorSystem is an actor system whose logs (protoactor's included) go
// to log; nil discards them.
func NewActorSystem(log *slog.Logger) *actor.ActorSystem {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return actor.NewActorSystem(actor.WithLoggerFactory(func(*actor.ActorSystem) *slog.Logger { return log }))
}

// StartRemote serves sys over protoactor remote on listen (host:port; port
// 0 picks a free one) under auth: mutual TLS with auth's credentials and a
// guard on every inbound stream, or, only if auth is trust.Insecure,
// plaintext. remote.Start panics when it cannot listen, so the address is
// checked and tried first, and a failure is an error with the address in
// it.
func StartRemote(sys *actor.ActorSystem, listen string, auth *trust.Authority) (*remote.Remote, error) {
	return startRemote(sys, listen, "", auth, false, 0)
}

// StartRemoteAdvertised is StartRemote for a process that peers reach at
// advertise (host:port), not at the address it listens on: through a
// proxy or a NAT that forwards advertise to listen. Its actors' PIDs name
// advertise, and the remote boundary takes messages for actors there. The
// address proof of trust still holds: a peer that dials advertise reaches
// this process's TLS and certificate. Empty advertise is StartRemote.
// A node's run passes its incarnation, non-zero, which its remote answers
// members' run challenge with (trust.RunProto).
func StartRemoteAdvertised(sys *actor.ActorSystem, listen, advertise string, incarnation uint64, auth *trust.Authority) (*remote.Remote, error) {
	return startRemote(sys, listen, advertise, auth, false, incarnation)
}

// StartRemoteAwaiting is StartRemote for a process that waits on other
// processes' answers in futures (Request, RequestFuture): the remote
// boundary lets replies reach its futures, which anyone with a cluster
// certificate can address. Nodes never need it.
func StartRemoteAwaiting(sys *actor.ActorSystem, listen string, auth *trust.Authority) (*remote.Remote, error) {
	return startRemote(sys, listen, "", auth, true, 0)
}

func startRemote(sys *actor.ActorSystem, listen, advertise string, auth *trust.Authority, futures bool, incarnation uint64) (*remote.Remote, error) {
	if auth == nil {
		return nil, errors.New("messages: no trust authority for remote (trust.Insecure runs without one)")
	}
	host, portStr, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("messages: listen address %q: %w", listen, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("messages: listen address %q: port %q must be 0 to 65535", listen, portStr)
	}
	if _, p, err := net.SplitHostPort(advertise); advertise != "" && (err != nil || p == "") {
		return nil, fmt.Errorf("messages: advertised address %q: want host:port", advertise)
	}
	probe, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("messages: cannot listen on %s: %w", listen, err)
	}
	if port == 0 {
		port = probe.Addr().(*net.TCPAddr).Port
	}
	probe.Close()
	self := fmt.Sprintf("%v:%v", host, port) // as protoactor writes its address
	var adv []remote.ConfigOption
	if advertise != "" {
		self, adv = advertise, []remote.ConfigOption{remote.WithAdvertisedHost(advertise)}
	}
	r := remote.NewRemote(sys, remote.Configure(host, port, append(remoteOptions(auth, self, futures, incarnation), adv...)...))
	g := &endpointGuard{r: r, drained: make(chan struct{})}
	sys.EventStream.Subscribe(g.before)
	r.Start()
	sys.EventStream.Subscribe(g.after)
	return r, nil
}

// remoteStopping tells r's endpoint-event guard that ShutdownRemote
// stops r; the guard answers in drained the channel closed once no
// event it let pass is still on its way to r's endpoint manager.
type remoteStopping struct {
	r       *remote.Remote
	drained *<-chan struct{}
}

// endpointGuard works around an upstream race: an endpoint writer whose
// stream fails publishes an EndpointTerminatedEvent from its own
// goroutine, and EventStream.Publish calls the handlers it saw subscribed
// when it began. If the remote's graceful Shutdown runs meanwhile (the
// endpoint manager unsubscribes, then sets its connections map to nil),
// the manager's handler, called late, dereferences the nil map and the
// panic, in a goroutine of protoactor's, ends the process: seen on a
// loaded machine when a node stopped as its peer did. The guard's before
// is subscribed just before r.Start subscribes the manager, and its after
// just after, so an event passes before, then the manager's handler, then
// after. Once ShutdownRemote has begun, before ends the publishing
// goroutine (runtime.Goexit: a writer's, whose last act the publish is),
// so the manager's handler is never called late; and ShutdownRemote waits
// until every event before let pass earlier has passed after too, so none
// is still inside the manager's handler when Shutdown begins.
type endpointGuard struct {
	r        *remote.Remote
	mu       sync.Mutex
	stopping bool
	passing  int           // events past before, not yet past after
	drained  chan struct{} // closed once stopping and none is passing
}

func (g *endpointGuard) before(evt any) {
	switch e := evt.(type) {
	case remoteStopping:
		if e.r != g.r {
			return
		}
		g.mu.Lock()
		if !g.stopping {
			g.stopping = true
			g.drainedIfIdle()
		}
		g.mu.Unlock()
		*e.drained = g.drained
	case *remote.EndpointTerminatedEvent:
		g.mu.Lock()
		stopping := g.stopping
		if !stopping {
			g.passing++
		}
		g.mu.Unlock()
		if stopping {
			runtime.Goexit()
		}
	}
}

func (g *endpointGuard) after(evt any) {
	if _, ok := evt.(*remote.EndpointTerminatedEvent); !ok {
		return
	}
	g.mu.Lock()
	g.passing = max(g.passing-1, 0)
	g.drainedIfIdle()
	g.mu.Unlock()
}

// drainedIfIdle closes drained once stopping and no event is passing;
// g.mu is held.
func (g *endpointGuard) drainedIfIdle() {
	if g.stopping && g.passing == 0 {
		select {
		case <-g.drained:
		default:
			close(g.drained)
		}
	}
}

// RemoteShutdownGrace bounds the graceful part of ShutdownRemote.
const RemoteShutdownGrace = time.Second

// ShutdownRemote shuts r down gracefully, which stops its endpoint writers
// (closing their gRPC connections) and readers, then the gRPC server, and
// forces the server down after RemoteShutdownGrace: gRPC's graceful stop
// waits for every inbound stream to end, and the stream of a peer that died
// without closing it ends only when upstream's own 10-second timeout fires.
//
// Upstream bug: when an endpoint reader's stream ends with an error rather
// than io.EOF (typically because the peer shut down first), the reader
// closes its disconnect channel but leaves it registered, and a later
// graceful Shutdown panics with "send on closed channel" in
// endpointManager.stop. By then the endpoint actors are already stopped, so
// the panic is recovered and the non-graceful Shutdown finishes the job.
//
// sys is r's actor system, whose event stream tells r's guard
// (endpointGuard) that r stops; ShutdownRemote waits, within
// RemoteShutdownGrace, for the endpoint events already on their way to
// r's endpoint manager.
func ShutdownRemote(sys *actor.ActorSystem, r *remote.Remote) {
	var drained <-chan struct{}
	sys.EventStream.Publish(remoteStopping{r: r, drained: &drained})
	if drained != nil {
		select {
		case <-drained:
		case <-time.After(RemoteShutdownGrace):
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() {
			if recover() != nil {
				r.Shutdown(false)
			}
		}()
		r.Shutdown(true)
	}()
	select {
	case <-done:
	case <-time.After(RemoteShutdownGrace):
		// The graceful goroutine ends by itself once its waits run out.
		r.Shutdown(false)
	}
}

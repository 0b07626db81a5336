// Package client is the Go client of kvwarden nodes: it reaches their
// admission actors through protoactor remote and streams a generation back.
//
// The common path is DialEndpoints(ctx, endpoints, options) (or Dial of one
// endpoint), then Generate(ctx, tenant, prompt, options, onToken) as many
// times as needed, concurrently if wished, then Close. Generate calls
// onToken for every token as it arrives and returns the final Result, or an
// error; errors from the node are *messages.WireError values with stable
// codes (prompt too long, busy, integrity failure, node lost, cancelled, bad
// request). Cancelling ctx cancels the request on the node that holds it,
// which releases its pages; closing GenerateOptions.Stop ends it there as
// completed (finish "stop_sequence"), as a caller that found a stop
// sequence of its own does, and releases them likewise.
//
// With several endpoints (routers, usually), new requests go round robin to
// the endpoints that are live: one whose connection ended, or that refused
// TCP or its certificate check, is skipped for a backoff (EndpointBackoffMin
// doubling to EndpointBackoffMax) and probed before it is used again. A
// request whose endpoint is lost (its connection ends mid-stream, or it
// answers node_lost) is continued through another endpoint it has not
// tried: the client sends the same prompt and max_tokens again under a new
// request id and, since greedy decoding is deterministic, checks that the
// tokens and text it has already delivered come back identical (otherwise
// the request ends with an integrity error, never with wrong output),
// suppresses them and delivers only what follows. Each endpoint carries a
// request at most once; a request with no endpoint left fails at once with
// node_lost naming the endpoints. An endpoint's unavailable (it sees no
// node of a role the request needs, where another router may) and a
// draining router's busy (messages.WhereDrainingRouter) go on to another
// endpoint the same way, and are returned as they came when none is left.
// Other errors (busy, too long, bad request, cancelled) are returned as
// they came.
//
// A Client is safe for concurrent use. Each attempt of a Generate call gets
// its own receiving actor, so calls never see each other's tokens.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
	"github.com/asynkron/protoactor-go/eventstream"
	"github.com/asynkron/protoactor-go/remote"

	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// AdmissionName is the name of a node's admission actor.
const AdmissionName = "admission"

// DefaultNoAnswerAfter is longer than a node's default request timeout
// (two minutes) and a router's margin over it, so that a request the node
// times out is reported as the node reports it, not as a lost node.
const DefaultNoAnswerAfter = 3 * time.Minute

// probeTimeout bounds the probe of an endpoint (a TCP connection, or a TLS
// handshake and the check of the node's certificate): without it, an
// address that drops packets would hold a request for the dialer's own
// timeout.
const probeTimeout = 2 * time.Second

// Options configure a Client.
type Options struct {
	// Listen is the local host:port the client's own remote endpoint
	// serves on, for the nodes' answers; "" means 127.0.0.1 on a free
	// port.
	Listen string
	// NoAnswerAfter bounds how long Generate waits between two messages
	// from the node before it gives the request up as lost there. Zero
	// means DefaultNoAnswerAfter. A connection that ends is noticed at once,
	// without this wait.
	NoAnswerAfter time.Duration
	// Log receives protoactor's logs; nil discards them.
	Log *slog.Logger
	// Auth holds the client's credentials (a tenant's or an operator's
	// certificate); Dial requires it. trust.Insecure reaches only nodes
	// that run --insecure.
	Auth *trust.Authority
	// Unbatched asks for every answer one message at a time. By default
	// a dialled client asks for batches: a node sends the tokens of many
	// requests to one process in one message (a node of a build before
	// batches answers one message at a time either way).
	Unbatched bool
}

// Client talks to one or more nodes that admit requests.
type Client struct {
	sys     *actor.ActorSystem
	remote  *remote.Remote
	timeout time.Duration
	nextID  atomic.Uint64
	refused atomic.Uint64
	// targets are the endpoints' admission actors, in the order given.
	targets []*actor.PID
	// probe checks that an endpoint answers before it is used again after
	// a failure; nil leaves it to the request itself.
	probe func(ctx context.Context, endpoint string) error
	sub   *eventstream.Subscription
	// streams takes the answers in batches; nil when the client asks for
	// none (Options.Unbatched, or a client in a node's actor system).
	streams *messages.Streams

	mu  sync.Mutex
	eps *endpointSet
	// lost holds, for each endpoint, one channel per attempt under way
	// there; each is closed when the client's connection to it ends.
	lost []map[chan struct{}]struct{}
	// probeEnd is closed (and replaced) whenever a probe ends, for the
	// requests that wait on it.
	probeEnd chan struct{}
}

// Dial starts the client's own actor system and remote endpoint and aims
// it at the node serving on endpoint (host:port). Nothing is sent until
// Generate.
func Dial(endpoint string, opt Options) (*Client, error) {
	return DialContext(context.Background(), endpoint, opt)
}

// DialContext is Dial, given up when ctx is done while it checks the
// node's certificate.
func DialContext(ctx context.Context, endpoint string, opt Options) (*Client, error) {
	return DialEndpoints(ctx, []string{endpoint}, opt)
}

// DialEndpoints is Dial of several endpoints (host:port each, routers
// usually) that serve one cluster. Each is probed first: a certificate
// refused either way, or one that is not a node's that admits requests, is
// an error at once; an endpoint that cannot be reached is an error only if
// none can, and is otherwise skipped until a later probe finds it.
func DialEndpoints(ctx context.Context, endpoints []string, opt Options) (*Client, error) {
	if err := checkEndpoints(endpoints); err != nil {
		return nil, err
	}
	if opt.Auth == nil {
		return nil, errors.New("client: Options.Auth is required (trust.Insecure reaches nodes that run --insecure)")
	}
	probe := func(ctx context.Context, endpoint string) error { return probeNode(ctx, opt.Auth, endpoint) }
	// All at once: an endpoint that does not answer costs its probe's
	// timeout once, not once per endpoint before it.
	probes, unreachable := make([]error, len(endpoints)), 0
	var wg sync.WaitGroup
	for i, e := range endpoints {
		wg.Go(func() { probes[i] = probe(ctx, e) })
	}
	wg.Wait()
	for _, err := range probes {
		if err != nil && (!errors.As(err, new(*unreachableError)) || ctx.Err() != nil) {
			return nil, err
		}
		if err != nil {
			unreachable++
		}
	}
	if unreachable == len(endpoints) {
		return nil, errors.Join(probes...)
	}
	now := time.Now()
	listen := opt.Listen
	if listen == "" {
		listen = "127.0.0.1:0"
	}
	sys := messages.NewActorSystem(opt.Log)
	r, err := messages.StartRemote(sys, listen, opt.Auth)
	if err != nil {
		sys.Shutdown()
		return nil, fmt.Errorf("client: %w", err)
	}
	targets := make([]*actor.PID, len(endpoints))
	for i, e := range endpoints {
		targets[i] = actor.NewPID(e, AdmissionName)
	}
	c := newClient(sys, targets, opt)
	c.remote, c.probe = r, probe
	if !opt.Unbatched {
		if c.streams, err = messages.NewStreams(sys); err != nil {
			c.Close()
			return nil, fmt.Errorf("client: %w", err)
		}
	}
	for i, err := range probes {
		c.eps.probed(i, now, err)
	}
	return c, nil
}

// EndpointsMax is the most endpoints one Client takes: DialEndpoints
// probes them all at once, and each request may try every one.
const EndpointsMax = 64

// checkEndpoints refuses an empty list, an address that is not host:port
// and one given twice, naming the value.
func checkEndpoints(endpoints []string) error {
	if len(endpoints) == 0 || len(endpoints) > EndpointsMax {
		return fmt.Errorf("client: %d endpoints given; want 1 to %d", len(endpoints), EndpointsMax)
	}
	seen := map[string]bool{}
	for _, e := range endpoints {
		if _, _, err := net.SplitHostPort(e); err != nil {
			return fmt.Errorf("client: endpoint %q: %w", e, err)
		}
		if seen[e] {
			return fmt.Errorf("client: endpoint %q given twice", e)
		}
		seen[e] = true
	}
	return nil
}

// unreachableError is an endpoint where nothing answered a TCP connection
// or a TLS handshake.
type unreachableError struct {
	endpoint string
	Err      error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("client: no node reachable at %s: %v", e.endpoint, e.Err)
}

func (e *unreachableError) Unwrap() error { return e.Err }

// tlsError is an endpoint whose TLS handshake failed once connected: a
// certificate refused either way.
type tlsError struct {
	endpoint string
	Err      error
}

func (e *tlsError) Error() string { return fmt.Sprintf("client: TLS with %s: %v", e.endpoint, e.Err) }

func (e *tlsError) Unwrap() error { return e.Err }

// notAdmissionError is an endpoint served by a node that does not admit
// requests.
type notAdmissionError struct {
	endpoint string
	id       trust.Identity
}

func (e *notAdmissionError) Error() string {
	return fmt.Sprintf("client: %s is served by %s, not a node that admits requests (router, decode or all)", e.endpoint, e.id)
}

// probeNode checks that the node at endpoint answers: with credentials, it
// completes a TLS handshake before anything is sent, so that a certificate
// refused either way is an error at once (with why) rather than a silent
// node, and requires the certificate there to be a node's that admits
// requests; insecure, it opens a TCP connection. Both are bounded by
// probeTimeout.
func probeNode(ctx context.Context, auth *trust.Authority, endpoint string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	if auth.Insecure() {
		conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", endpoint)
		if err != nil {
			return &unreachableError{endpoint, err}
		}
		return conn.Close()
	}
	id, _, err := auth.Peers().ProbeContext(ctx, endpoint)
	var netErr *net.OpError
	switch {
	case errors.As(err, &netErr) && netErr.Op == "dial", errors.Is(err, context.DeadlineExceeded):
		return &unreachableError{endpoint, err}
	case err != nil:
		return &tlsError{endpoint, err}
	case id.Role != trust.RoleRouter && !id.Role.Decodes():
		return &notAdmissionError{endpoint, id}
	}
	return nil
}

// New is a client inside an existing actor system, aimed at a node's
// admission actor (in the same process, or remote if sys has remote).
func New(sys *actor.ActorSystem, admission *actor.PID, opt Options) *Client {
	return newClient(sys, []*actor.PID{admission}, opt)
}

func newClient(sys *actor.ActorSystem, targets []*actor.PID, opt Options) *Client {
	addrs := make([]string, len(targets))
	lost := make([]map[chan struct{}]struct{}, len(targets))
	for i, t := range targets {
		addrs[i], lost[i] = t.Address, map[chan struct{}]struct{}{}
	}
	c := &Client{sys: sys, targets: targets, timeout: opt.NoAnswerAfter, eps: newEndpointSet(addrs), lost: lost,
		probeEnd: make(chan struct{})}
	if c.timeout <= 0 {
		c.timeout = DefaultNoAnswerAfter
	}
	// Request ids are unique per client; start from the clock so that a
	// restarted client does not reuse its predecessor's first ids.
	c.nextID.Store(uint64(time.Now().UnixNano()))
	// onEvent takes the endpoint events and ignores the others. No
	// subscription predicate: protoactor's SubscribeWithPredicate sets it
	// after the subscription is published, unlocked, and a concurrent
	// Publish (a dead letter of a node's actors in this process, say)
	// reads it, a data race the race detector reported in CI.
	c.sub = sys.EventStream.Subscribe(c.onEvent)
	return c
}

// onEvent follows the client's connections to its endpoints, as
// protoactor remote reports them, and ignores every other event. It runs
// on the publisher's goroutine and never blocks.
func (c *Client) onEvent(evt any) {
	switch e := evt.(type) {
	case *remote.EndpointTerminatedEvent:
		c.endpointFailed(e.Address, "its connection ended")
	case *remote.EndpointConnectedEvent:
		c.mu.Lock()
		defer c.mu.Unlock()
		if i := c.eps.index(e.Address); i >= 0 {
			c.eps.connected(i)
		}
	}
}

// endpointFailed skips the endpoint at addr for its backoff and tells
// every attempt under way there.
func (c *Client) endpointFailed(addr, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.eps.index(addr)
	if i < 0 {
		return
	}
	c.eps.failed(i, time.Now(), why)
	for ch := range c.lost[i] {
		close(ch)
	}
	clear(c.lost[i])
}

// Close stops following the endpoints and, if Dial started them, the
// client's remote endpoint and actor system.
func (c *Client) Close() {
	c.sys.EventStream.Unsubscribe(c.sub)
	if c.remote != nil {
		messages.ShutdownRemote(c.sys, c.remote)
		c.sys.Shutdown()
	}
}

// GenerateOptions are per request.
type GenerateOptions struct {
	// MaxTokens is the most tokens to generate, at least 1.
	MaxTokens int
	// OnText, if set, receives the text of each streamed chunk as the node
	// decoded it, on the client's goroutine: complete UTF-8 characters,
	// joined from the model's byte pieces. What the stream held back at
	// its end (an incomplete character) is in Result.Text only.
	OnText func(string)
	// OnContinue, if set, is told on the client's goroutine when the
	// request is continued through another endpoint: why the last one
	// was given up, and the next.
	OnContinue func(lost *messages.WireError, next string)
	// Stop, if set, ends the request early as completed once it is
	// closed: the caller has what it wants of the answer (a stop sequence
	// of its own came). The node ends the request at the tokens it has
	// generated by then, which may be a few more than were delivered, and
	// frees its pages; Generate returns them with Finish "stop_sequence",
	// or the request's own end if that came first. Closed before the
	// first token, the request is withdrawn instead (there is nothing to
	// complete): the node answers cancelled. A request whose endpoint is
	// lost once Stop is closed is not continued elsewhere: Generate
	// returns what was delivered, as stopped.
	Stop <-chan struct{}
	// CacheSalt, if set, narrows the prefix cache the request shares
	// with its tenant's other requests (or its group's, as the operator
	// declared) to those that give the same salt, at most
	// kv.CacheSaltBytesMax bytes: a salt per end user keeps one user's
	// cached prompts from speeding up (and so from being told apart by)
	// another's. It never widens the scope.
	CacheSalt string
}

// Result is a finished generation.
type Result struct {
	Tokens []int
	Text   string
	// Finish is "stop" (end of sequence), "length" (MaxTokens reached)
	// or "stop_sequence" (ended by GenerateOptions.Stop).
	Finish string
	// Continued is how many times the request was continued through
	// another endpoint; Replayed is how many tokens those continuations
	// computed again (and the client checked and withheld) because they
	// had been delivered before.
	Continued, Replayed int
	// CachedTokens is how many of the prompt's tokens were read from the
	// prefix cache instead of computed (by the last endpoint).
	CachedTokens int
}

// ErrNoAnswer matches (errors.Is) the error of a request the node stopped
// answering; it is a *messages.WireError with CodeNodeLost.
var ErrNoAnswer = &messages.WireError{Code: messages.CodeNodeLost}

// Generate sends one request and streams its tokens to onToken (which may
// be nil) as they come. It returns the final answer: a Result, or a
// *messages.WireError. A request whose endpoint is lost is continued
// through another (see the package documentation). Cancelling ctx cancels
// the request on the node that holds it; the error is then ctx's.
func (c *Client) Generate(ctx context.Context, tenant, prompt string, opt GenerateOptions, onToken func(int)) (Result, error) {
	if opt.MaxTokens < 1 || opt.MaxTokens > messages.GenerateTokensMax {
		return Result{}, fmt.Errorf("client: MaxTokens (%d) must be 1 to %d", opt.MaxTokens, messages.GenerateTokensMax)
	}
	req := &messages.GenerateRequest{RequestID: 1, Tenant: tenant, Prompt: prompt, MaxTokens: uint32(opt.MaxTokens), Stream: true,
		CacheSalt: opt.CacheSalt}
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	d := &delivery{}
	var tried []int
	var last *messages.WireError
	for {
		if err := ctx.Err(); err != nil {
			// Sent, the request would reserve pages on a node only to be
			// cancelled there.
			return Result{}, err
		}
		i, lost, err := c.choose(ctx, tried)
		if err != nil {
			return Result{}, c.noEndpoint(err, tried, last)
		}
		tried = append(tried, i)
		if last != nil && opt.OnContinue != nil {
			opt.OnContinue(last, c.targets[i].Address)
		}
		a := &attempt{c: c, target: c.targets[i], lost: lost, tenant: tenant, maxTokens: opt.MaxTokens, d: d, onToken: onToken,
			onText: opt.OnText, stop: opt.Stop}
		sent := *req // a message is never changed once sent
		sent.RequestID = c.nextID.Add(1)
		res, err := a.run(ctx, &sent)
		c.mu.Lock()
		delete(c.lost[i], lost)
		c.mu.Unlock()
		if !errors.As(err, &last) || !a.continuable {
			res.Continued, res.Replayed = len(tried)-1, d.replayed
			return res, err
		}
	}
}

// noEndpoint is the error of a request that found no endpoint to go to:
// ctx's, or node_lost naming the endpoints. A request that was under way
// on the only endpoint ends with that endpoint's error as it came.
func (c *Client) noEndpoint(err error, tried []int, last *messages.WireError) error {
	if !errors.Is(err, errNoEndpoint) {
		return err
	}
	c.mu.Lock()
	state := c.eps.describe(time.Now())
	c.mu.Unlock()
	switch {
	case last == nil:
		return &messages.WireError{Code: messages.CodeNodeLost, Message: "no live endpoint: " + state}
	case len(c.targets) == 1 || last.Code != messages.CodeNodeLost:
		return last
	}
	names := make([]string, len(tried))
	for k, i := range tried {
		names[k] = c.targets[i].Address
	}
	return &messages.WireError{Code: messages.CodeNodeLost, Where: last.Where, Have: last.Have, Limit: last.Limit,
		Message: fmt.Sprintf("%s; no endpoint left to continue through (tried %s; endpoints %s)", last.Message,
			strings.Join(names, ", "), state)}
}

// errNoEndpoint is choose finding every endpoint tried or skipped.
var errNoEndpoint = errors.New("client: no endpoint left")

// choose picks the endpoint of an attempt, not one in tried, probing it
// first when it failed before, and registers the attempt's lost channel
// there. The registration and the check that the endpoint is live are one
// step under the lock, so that a connection that ends after it is always
// told to the attempt.
func (c *Client) choose(ctx context.Context, tried []int) (int, chan struct{}, error) {
	for {
		c.mu.Lock()
		ch := c.eps.pick(time.Now(), tried)
		switch {
		case ch.index >= 0 && (!ch.probe || c.probe == nil):
			defer c.mu.Unlock()
			if ch.probe {
				// Nothing to probe with (New): the request finds out.
				c.eps.probed(ch.index, time.Now(), nil)
			}
			lost := make(chan struct{})
			c.lost[ch.index][lost] = struct{}{}
			return ch.index, lost, nil
		case ch.index >= 0:
			c.mu.Unlock()
			// Another request may use the outcome: the probe runs to its
			// own bound even if this request is cancelled meanwhile.
			err := c.probe(context.WithoutCancel(ctx), c.targets[ch.index].Address)
			c.mu.Lock()
			c.eps.probed(ch.index, time.Now(), err)
			close(c.probeEnd)
			c.probeEnd = make(chan struct{})
			c.mu.Unlock()
		case ch.wait:
			wait := c.probeEnd
			c.mu.Unlock()
			select {
			case <-wait:
			case <-ctx.Done():
				return -1, nil, ctx.Err()
			}
		default:
			c.mu.Unlock()
			return -1, nil, errNoEndpoint
		}
		if ctx.Err() != nil {
			return -1, nil, ctx.Err()
		}
	}
}

// attempt is one request of a Generate call, through one endpoint.
type attempt struct {
	c         *Client
	target    *actor.PID
	lost      chan struct{} // closed when the connection to target ends
	tenant    string
	maxTokens int
	d         *delivery
	onToken   func(int)
	onText    func(string)
	stop      <-chan struct{} // GenerateOptions.Stop
	// continuable says that the request ended with the endpoint lost and
	// may go on through another: set when it ends with node_lost and was
	// not cancelled.
	continuable bool
}

// run sends req (a fresh request id) to the attempt's endpoint and
// streams its answer.
func (a *attempt) run(ctx context.Context, req *messages.GenerateRequest) (Result, error) {
	a.d.attempt(a.target.Address)
	// The receiver takes chunks of MaxTokens tokens in all (one at least
	// each) and one answer (a result, an undecodable message or a dead
	// letter), so the inbox never fills and the receiving actor never
	// blocks, however much a node sends.
	inbox := make(chan any, int(req.MaxTokens)+1)
	// take checks a chunk, result or undecodable message from s and puts
	// it in the inbox. The receiver calls it, and the client's Inbox for
	// what comes in batches: mu orders the two.
	var mu sync.Mutex
	seq, left, answered := uint32(0), int(req.MaxTokens), false
	id := req.RequestID
	take := func(s *actor.PID, m any) {
		mu.Lock()
		defer mu.Unlock()
		switch m := m.(type) {
		case *messages.TokenChunk:
			if a.fromNode(s, m.RequestID, id) && a.c.inSequence(m.Seq, len(m.Tokens), &seq, &left) {
				inbox <- m
			}
		case *messages.GenerateResult:
			if a.fromNode(s, m.RequestID, id) && a.c.first(&answered) {
				inbox <- m
			}
		case *messages.Undecodable:
			if a.fromNode(s, id, id) && a.c.first(&answered) {
				inbox <- m
			}
		case *actor.DeadLetterResponse:
			// The endpoint could not be reached: protoactor answers so
			// for a message its connection could not carry. It ends the
			// attempt, as an answer would: one is enough.
			if a.target.Equal(m.Target) && !answered {
				answered = true
				inbox <- m
			}
		}
	}
	name := trust.SecretName()
	if a.c.streams != nil {
		name = messages.BatchedName(name) // the answer comes in batches, to the client's Inbox
	}
	rx, err := a.c.sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *messages.TokenChunk, *messages.GenerateResult, *messages.Undecodable, *actor.DeadLetterResponse:
			take(ctx.Sender(), m)
		}
	}), name)
	if err != nil {
		return Result{}, fmt.Errorf("client: spawning the receiver: %w", err)
	}
	if s := a.c.streams; s != nil {
		s.Register(rx.Id, func(from *actor.PID, it *messages.StreamItem) { take(from, it.Message()) })
		defer s.Unregister(rx.Id)
	}
	defer a.c.sys.Root.Stop(rx)
	a.c.sys.Root.RequestWithCustomSender(a.target, req, rx)
	return a.await(ctx, id, rx, inbox)
}

// fromNode says whether a message for request id came from the node the
// request was sent to (the remote boundary proved the sender's address)
// and is for request want. Anything else is counted in Refused and
// dropped: a stranger cannot put a token or an answer into a request.
func (a *attempt) fromNode(s *actor.PID, id, want uint64) bool {
	local := s == nil && a.target.Address == a.c.sys.Address()
	if (!local && (s == nil || s.Address != a.target.Address)) || id != want {
		a.c.refused.Add(1)
		return false
	}
	return true
}

// inSequence says whether a token chunk numbered seq, of n tokens, follows
// the last (*last) within the tokens the request may yet stream (*left),
// and moves both on.
func (c *Client) inSequence(seq uint32, n int, last *uint32, left *int) bool {
	if seq != *last+1 || n < 1 || n > *left {
		c.refused.Add(1)
		return false
	}
	*last, *left = seq, *left-n
	return true
}

// first says whether this is the attempt's first answer (*answered), and
// records that one came.
func (c *Client) first(answered *bool) bool {
	if *answered {
		c.refused.Add(1)
		return false
	}
	*answered = true
	return true
}

// Refused is how many messages from strangers (another sender, another
// request's id, out of sequence) or past what a request may be sent (more
// tokens than MaxTokens, a second answer) the client has dropped.
func (c *Client) Refused() uint64 { return c.refused.Load() }

func (a *attempt) await(ctx context.Context, id uint64, rx *actor.PID, inbox chan any) (Result, error) {
	cancelled := false
	timer := time.NewTimer(a.c.timeout)
	defer timer.Stop()
	done, stop := ctx.Done(), a.stop
	for {
		select {
		case <-done:
			// Tell the node, then wait for its answer so that the caller
			// knows the request is over there too.
			a.cancel(id, rx, messages.CancelWithdraw)
			cancelled, done = true, nil
		case <-stop:
			// Likewise: the node's answer is the request's end.
			a.cancel(id, rx, messages.CancelStop)
			stop = nil
		case <-a.lost:
			return a.endpointLost(ctx, cancelled, "the connection to it ended")
		case <-timer.C:
			silent := &messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("no answer from %s within %s", a.target.Address, a.c.timeout), Where: a.target.Address}
			if cancelled {
				// The node never confirmed the cancel; for the caller the
				// request ended by ctx all the same.
				return Result{}, errors.Join(ctx.Err(), silent)
			}
			// A silent node may yet hold the request: cancel it there
			// before it goes on elsewhere, or ends as stopped.
			a.cancel(id, rx, messages.CancelWithdraw)
			if isClosed(a.stop) {
				return a.delivered(), nil
			}
			a.continuable = true
			return Result{}, silent
		case m := <-inbox:
			timer.Reset(a.c.timeout)
			if res, err, over := a.take(ctx, id, rx, m, cancelled); over {
				return res, err
			}
		}
	}
}

// cancel asks the endpoint to end request id early, for reason.
func (a *attempt) cancel(id uint64, rx *actor.PID, reason messages.CancelReason) {
	a.c.sys.Root.RequestWithCustomSender(a.target, &messages.CancelRequest{RequestID: id, Tenant: a.tenant, Reason: reason}, rx)
}

// isClosed says whether ch, which may be nil, is closed.
func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// delivered is the answer of a request its caller stopped whose endpoint
// went before it answered: what the caller was handed, as stopped.
func (a *attempt) delivered() Result {
	return result(a.d.tokens, a.d.text.String(), messages.FinishStopSequence)
}

// result is a Result of tokens, text and finish.
func result(tokens []uint32, text string, finish messages.FinishReason) Result {
	r := Result{Tokens: make([]int, len(tokens)), Text: text, Finish: finish.String()}
	for i, t := range tokens {
		r.Tokens[i] = int(t)
	}
	return r
}

// endpointLost ends an attempt whose endpoint is gone: continuable unless
// the request was cancelled, whose end it is then, or stopped, which ends
// with what was delivered.
func (a *attempt) endpointLost(ctx context.Context, cancelled bool, why string) (Result, error) {
	switch {
	case cancelled:
		return Result{}, ctx.Err()
	case isClosed(a.stop):
		return a.delivered(), nil
	}
	a.continuable = true
	return Result{}, &messages.WireError{Code: messages.CodeNodeLost, Where: a.target.Address,
		Message: fmt.Sprintf("%s lost after %d tokens: %s", a.target.Address, len(a.d.tokens), why)}
}

// take handles one message of the attempt's inbox; over says the attempt
// has ended with res and err.
func (a *attempt) take(ctx context.Context, id uint64, rx *actor.PID, m any, cancelled bool) (res Result, err error, over bool) {
	switch m := m.(type) {
	case *messages.TokenChunk:
		fresh, text, err := a.d.chunk(m.Tokens, m.Text)
		if err != nil {
			if !cancelled {
				a.cancel(id, rx, messages.CancelWithdraw)
			}
			return Result{}, err, true
		}
		if cancelled {
			return Result{}, nil, false
		}
		for _, t := range fresh {
			if a.onToken != nil {
				a.onToken(int(t))
			}
		}
		if a.onText != nil && text != "" {
			a.onText(text)
		}
	case *messages.Undecodable:
		return Result{}, m, true
	case *actor.DeadLetterResponse:
		a.c.endpointFailed(a.target.Address, "it could not be reached")
		res, err := a.endpointLost(ctx, cancelled, "it could not be reached")
		return res, err, true
	case *messages.GenerateResult:
		res, err := a.result(ctx, m, cancelled)
		return res, err, true
	}
	return Result{}, nil, false
}

// result is the attempt's end from the node's final answer.
func (a *attempt) result(ctx context.Context, m *messages.GenerateResult, cancelled bool) (Result, error) {
	switch {
	case cancelled && m.Err == nil:
		return Result{}, ctx.Err() // answered before the cancel reached the node
	case cancelled:
		return Result{}, errors.Join(ctx.Err(), m.Err)
	case m.Err != nil:
		// node_lost from the node: a node on the request's path was lost,
		// and another endpoint may find another path. unavailable: the
		// endpoint sees no node of a role the request needs, and another
		// may see one. A draining router's busy: another router may take
		// the request.
		a.continuable = m.Err.Code == messages.CodeNodeLost || m.Err.Code == messages.CodeUnavailable ||
			m.Err.Code == messages.CodeBusy && m.Err.Where == messages.WhereDrainingRouter
		return Result{}, m.Err
	}
	if len(m.Tokens) > a.maxTokens {
		return Result{}, &messages.WireError{Code: messages.CodeIntegrity, Where: a.target.Address,
			Message: fmt.Sprintf("the answer through %s has %d tokens, %d were asked for", a.target.Address, len(m.Tokens),
				a.maxTokens), Have: uint64(len(m.Tokens)), Limit: uint64(a.maxTokens)}
	}
	if err := a.d.result(m.Tokens, m.Text); err != nil {
		return Result{}, err
	}
	res := result(m.Tokens, m.Text, m.FinishReason)
	res.CachedTokens = int(m.CachedTokens)
	return res, nil
}

// Package client is the Go client of a kvwarden node: it reaches the node's
// admission actor through protoactor remote and streams a generation back.
//
// The common path is Dial(endpoint), then Generate(ctx, tenant, prompt,
// options, onToken) as many times as needed, concurrently if wished, then
// Close. Generate calls onToken for every token as it arrives and returns
// the final Result, or an error; errors from the node are
// *messages.WireError values with stable codes (prompt too long, busy,
// integrity failure, node lost, cancelled, bad request). Cancelling ctx
// cancels the request on the node, which releases its pages.
//
// A Client is safe for concurrent use. Each Generate call gets its own
// receiving actor, so calls never see each other's tokens.
package client

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync/atomic"
	"time"

	"github.com/asynkron/protoactor-go/actor"
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

// Options configure a Client.
type Options struct {
	// Listen is the local host:port the client's own remote endpoint
	// serves on, for the node's answers; "" means 127.0.0.1 on a free
	// port.
	Listen string
	// NoAnswerAfter bounds how long Generate waits between two messages
	// from the node before it gives the request up as lost. Zero means
	// DefaultNoAnswerAfter.
	NoAnswerAfter time.Duration
	// Log receives protoactor's logs; nil discards them.
	Log *slog.Logger
	// Auth holds the client's credentials (a tenant's or an operator's
	// certificate); Dial requires it. trust.Insecure reaches only nodes
	// that run --insecure.
	Auth *trust.Authority
}

// Client talks to one node.
type Client struct {
	sys     *actor.ActorSystem
	remote  *remote.Remote
	target  *actor.PID
	timeout time.Duration
	nextID  atomic.Uint64
	refused atomic.Uint64
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
	if _, _, err := net.SplitHostPort(endpoint); err != nil {
		return nil, fmt.Errorf("client: endpoint %q: %w", endpoint, err)
	}
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
	c := New(sys, actor.NewPID(endpoint, AdmissionName), opt)
	c.remote = r
	if err := checkNode(ctx, opt.Auth, endpoint); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// checkNode completes a TLS handshake with endpoint before anything is
// sent, so that a certificate refused either way is an error at once (with
// why) rather than a silent node, and requires the certificate there to be
// a node's that admits requests.
func checkNode(ctx context.Context, auth *trust.Authority, endpoint string) error {
	if auth.Insecure() {
		return nil
	}
	id, _, err := auth.Peers().ProbeContext(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("client: TLS with %s: %w", endpoint, err)
	}
	if id.Role != trust.RoleRouter && !id.Role.Decodes() {
		return fmt.Errorf("client: %s is served by %s, not a node that admits requests (router, decode or all)", endpoint, id)
	}
	return nil
}

// New is a client inside an existing actor system, aimed at a node's
// admission actor (in the same process, or remote if sys has remote).
func New(sys *actor.ActorSystem, admission *actor.PID, opt Options) *Client {
	c := &Client{sys: sys, target: admission, timeout: opt.NoAnswerAfter}
	if c.timeout <= 0 {
		c.timeout = DefaultNoAnswerAfter
	}
	// Request ids are unique per client; start from the clock so that a
	// restarted client does not reuse its predecessor's first ids.
	c.nextID.Store(uint64(time.Now().UnixNano()))
	return c
}

// Close stops the client's remote endpoint and actor system, if Dial
// started them.
func (c *Client) Close() {
	if c.remote != nil {
		messages.ShutdownRemote(c.remote)
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
}

// Result is a finished generation.
type Result struct {
	Tokens []int
	Text   string
	// Finish is "stop" (end of sequence) or "length" (MaxTokens reached).
	Finish string
}

// ErrNoAnswer matches (errors.Is) the error of a request the node stopped
// answering; it is a *messages.WireError with CodeNodeLost.
var ErrNoAnswer = &messages.WireError{Code: messages.CodeNodeLost}

// Generate sends one request and streams its tokens to onToken (which may
// be nil) as they come. It returns the node's final answer: a Result, or a
// *messages.WireError. Cancelling ctx cancels the request on the node; the
// error is then ctx's.
func (c *Client) Generate(ctx context.Context, tenant, prompt string, opt GenerateOptions, onToken func(int)) (Result, error) {
	if opt.MaxTokens < 1 || opt.MaxTokens > messages.GenerateTokensMax {
		return Result{}, fmt.Errorf("client: MaxTokens (%d) must be 1 to %d", opt.MaxTokens, messages.GenerateTokensMax)
	}
	id := c.nextID.Add(1)
	req := &messages.GenerateRequest{RequestID: id, Tenant: tenant, Prompt: prompt, MaxTokens: uint32(opt.MaxTokens), Stream: true}
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	// One message per token and one result, so this never blocks the
	// receiving actor.
	inbox := make(chan any, opt.MaxTokens+2)
	seq := uint32(0)
	rx, err := c.sys.Root.SpawnNamed(actor.PropsFromFunc(func(ctx actor.Context) {
		switch m := ctx.Message().(type) {
		case *messages.TokenChunk:
			if c.fromNode(ctx, m.RequestID, id) && c.inSequence(m.Seq, &seq) {
				inbox <- m
			}
		case *messages.GenerateResult:
			if c.fromNode(ctx, m.RequestID, id) {
				inbox <- m
			}
		case *messages.Undecodable:
			if c.fromNode(ctx, id, id) {
				inbox <- m
			}
		}
	}), trust.SecretName())
	if err != nil {
		return Result{}, fmt.Errorf("client: spawning the receiver: %w", err)
	}
	defer c.sys.Root.Stop(rx)
	c.sys.Root.RequestWithCustomSender(c.target, req, rx)
	return c.await(ctx, id, tenant, rx, inbox, onToken, opt.OnText)
}

// fromNode says whether a message for request id came from the node the
// request was sent to (the remote boundary proved the sender's address)
// and is for request want. Anything else is counted in Refused and
// dropped: a stranger cannot put a token or an answer into a request.
func (c *Client) fromNode(ctx actor.Context, id, want uint64) bool {
	s := ctx.Sender()
	local := s == nil && c.target.Address == c.sys.Address()
	if (!local && (s == nil || s.Address != c.target.Address)) || id != want {
		c.refused.Add(1)
		return false
	}
	return true
}

// inSequence says whether a token chunk numbered seq follows the last
// (*last), and moves *last on.
func (c *Client) inSequence(seq uint32, last *uint32) bool {
	if seq != *last+1 {
		c.refused.Add(1)
		return false
	}
	*last = seq
	return true
}

// Refused is how many messages from strangers (another sender, another
// request's id, out of sequence) the client has dropped.
func (c *Client) Refused() uint64 { return c.refused.Load() }

func (c *Client) await(ctx context.Context, id uint64, tenant string, rx *actor.PID, inbox chan any, onToken func(int),
	onText func(string)) (Result, error) {
	cancelled := false
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	done := ctx.Done()
	for {
		select {
		case <-done:
			// Tell the node, then wait for its answer so that the caller
			// knows the request is over there too.
			c.sys.Root.RequestWithCustomSender(c.target, &messages.CancelRequest{RequestID: id, Tenant: tenant}, rx)
			cancelled, done = true, nil
		case <-timer.C:
			return Result{}, &messages.WireError{Code: messages.CodeNodeLost,
				Message: fmt.Sprintf("no answer from %s within %s", c.target.Address, c.timeout), Where: c.target.Address}
		case m := <-inbox:
			timer.Reset(c.timeout)
			switch m := m.(type) {
			case *messages.TokenChunk:
				for _, t := range m.Tokens {
					if onToken != nil && !cancelled {
						onToken(int(t))
					}
				}
				if onText != nil && !cancelled && m.Text != "" {
					onText(m.Text)
				}
			case *messages.Undecodable:
				return Result{}, m
			case *messages.GenerateResult:
				if cancelled && m.Err == nil {
					return Result{}, ctx.Err() // answered before the cancel reached the node
				}
				if cancelled {
					return Result{}, errors.Join(ctx.Err(), m.Err)
				}
				if m.Err != nil {
					return Result{}, m.Err
				}
				r := Result{Tokens: make([]int, len(m.Tokens)), Text: m.Text, Finish: m.FinishReason.String()}
				for i, t := range m.Tokens {
					r.Tokens[i] = int(t)
				}
				return r, nil
			}
		}
	}
}

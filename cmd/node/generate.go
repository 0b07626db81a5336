package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"log/slog"

	"github.com/kvwarden/kvwarden/client"
	"github.com/kvwarden/kvwarden/messages"
	"github.com/kvwarden/kvwarden/trust"
)

// reachTimeout bounds the TCP connection generate opens first to find out
// whether a node listens at all: without it, a request to an address where
// nothing listens would wait for --no-answer-after before failing.
const reachTimeout = 5 * time.Second

// cancelGrace bounds how long generate waits, after Ctrl-C, for the node to
// confirm the cancellation (upon which it has released the request's
// pages). A node that does not answer in time cancels the request at its
// own RequestTimeout.
const cancelGrace = 5 * time.Second

// generateOptions are the flags of "node generate".
// defaultMaxTokens is what generate and up ask for unless told: the 256
// positions llama2.c's runner generates by default.
const defaultMaxTokens = 256

type generateOptions struct {
	// Endpoint is the node's host:port, or several, comma-separated.
	Endpoint string
	Tenant   string
	Prompt   string
	// PromptGiven says --prompt was given: an empty prompt is a prompt.
	PromptGiven bool
	MaxTokens   int
	// CacheSalt narrows the prefix cache scope the request shares.
	CacheSalt     string
	NoAnswerAfter time.Duration
	creds         credFlags
}

func newGenerateCmd() *cobra.Command {
	o := generateOptions{Endpoint: defaultEndpoint, MaxTokens: defaultMaxTokens, NoAnswerAfter: client.DefaultNoAnswerAfter}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Send one prompt to a node and stream the generated text",
		Long: `generate sends one prompt to the node at --endpoint and prints the generated text
to stdout as the tokens arrive, then a newline; a summary (tokens, finish
reason, time to first token, total time) goes to stderr. --prompt - reads the
prompt from stdin, byte for byte.

--endpoint takes several routers, comma-separated: the request goes to one
that answers, and if that router is lost while the answer streams, the
request is continued through another (the tokens already printed are
computed again there, checked to be identical and not printed twice; the
summary says how many); with none left it fails with node_lost.

Exit codes: 0 generated, 1 the node refused or failed the request (printed as
"node: <code name> (<code>): <message>") or could not be reached, 2 usage
error, 130 interrupted by Ctrl-C (the request is cancelled on the node).`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.PromptGiven = cmd.Flags().Changed("prompt")
			prompt, err := o.check(cmd.InOrStdin())
			if err != nil {
				return usageError{err}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			// A second Ctrl-C, while the cancellation is under way, kills
			// the process as it would without this handler.
			context.AfterFunc(ctx, stop)
			return generate(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), o, prompt)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&o.Endpoint, "endpoint", o.Endpoint, "host:port of the node (where node run listens); several routers comma-separated")
	fs.StringVar(&o.Tenant, "tenant", o.Tenant, "tenant the request belongs to (required)")
	fs.StringVar(&o.Prompt, "prompt", o.Prompt, "the prompt, \"\" for none (the model's BOS alone); - reads it from stdin (required)")
	fs.IntVar(&o.MaxTokens, "max-tokens", o.MaxTokens, "most tokens to generate")
	fs.StringVar(&o.CacheSalt, "cache-salt", o.CacheSalt, "share cached prompt prefixes only with the tenant's requests that give the same salt")
	fs.DurationVar(&o.NoAnswerAfter, "no-answer-after", o.NoAnswerAfter, "give the node up as lost after this long without a message from it")
	o.creds.bind(fs, "tenant-<--tenant>")
	return cmd
}

// check validates the options before anything is sent, with the limits the
// node itself would apply to the message, and returns the prompt (read from
// stdin for "-").
func (o generateOptions) check(stdin io.Reader) (string, error) {
	if _, err := o.endpoints(); err != nil {
		return "", err
	}
	if o.NoAnswerAfter <= 0 {
		return "", fmt.Errorf("--no-answer-after (%s) must be positive", o.NoAnswerAfter)
	}
	prompt := o.Prompt
	if prompt == "-" {
		data, err := io.ReadAll(io.LimitReader(stdin, messages.PromptBytesMax+1))
		if err != nil {
			return "", fmt.Errorf("reading the prompt from stdin: %w", err)
		}
		if len(data) > messages.PromptBytesMax {
			return "", fmt.Errorf("the prompt on stdin is longer than %d bytes", messages.PromptBytesMax)
		}
		prompt = string(data)
	}
	switch {
	case o.Tenant == "":
		return "", fmt.Errorf("--tenant is required")
	case !o.PromptGiven:
		return "", fmt.Errorf("--prompt is required: give --prompt TEXT, --prompt \"\" for none, or --prompt - to read it from stdin")
	case o.MaxTokens < 1 || o.MaxTokens > messages.GenerateTokensMax:
		return "", fmt.Errorf("--max-tokens (%d) must be 1 to %d", o.MaxTokens, messages.GenerateTokensMax)
	}
	req := &messages.GenerateRequest{RequestID: 1, Tenant: o.Tenant, Prompt: prompt, MaxTokens: uint32(o.MaxTokens), Stream: true}
	return prompt, req.Validate()
}

// endpoints are the addresses of --endpoint, each checked, none twice.
func (o generateOptions) endpoints() ([]string, error) {
	list := strings.Split(o.Endpoint, ",")
	seen := map[string]bool{}
	for _, e := range list {
		if err := checkEndpoint(e); err != nil {
			return nil, err
		}
		if seen[e] {
			return nil, fmt.Errorf("--endpoint %q names %s twice", o.Endpoint, e)
		}
		seen[e] = true
	}
	return list, nil
}

// reachAny opens a TCP connection to each endpoint until one answers, so
// that a command where no node listens fails at once rather than after
// --no-answer-after, and before it needs credentials.
func reachAny(endpoints []string) error {
	var errs []error
	for _, e := range endpoints {
		conn, err := net.DialTimeout("tcp", e, reachTimeout)
		if err == nil {
			return conn.Close()
		}
		errs = append(errs, fmt.Errorf("no node reachable at %s: %w", e, err))
	}
	return errors.Join(errs...)
}

// generate sends the request and prints its tokens as they come. An error
// from the node is returned as it came (a *messages.WireError), so that the
// command prints its code and message.
func generate(ctx context.Context, stdout, stderr io.Writer, o generateOptions, prompt string) error {
	endpoints, err := o.endpoints()
	if err != nil {
		return usageError{err}
	}
	if err := reachAny(endpoints); err != nil {
		return fmt.Errorf("generate: %w", err)
	}
	// node up writes its credentials for every router's address: the
	// first endpoint names the cluster.
	o.creds.Endpoint = endpoints[0]
	auth, err := o.creds.authority(slog.New(slog.NewTextHandler(stderr, nil)), trust.RoleTenant,
		trust.FileName(trust.Identity{Role: trust.RoleTenant, Name: o.Tenant}))
	if err != nil {
		return err
	}
	c, err := client.DialEndpoints(ctx, endpoints, client.Options{NoAnswerAfter: o.NoAnswerAfter, Auth: auth})
	if err != nil {
		if ctx.Err() != nil {
			return interruptedError{}
		}
		return fmt.Errorf("generate: %w", err)
	}
	p := &tokenPrinter{w: stdout, start: time.Now(), escape: isTerminal(stdout)}
	type answer struct {
		res client.Result
		err error
	}
	answered := make(chan answer, 1)
	go func() {
		res, err := c.Generate(ctx, o.Tenant, prompt, client.GenerateOptions{MaxTokens: o.MaxTokens, OnText: p.text, CacheSalt: o.CacheSalt}, p.token)
		answered <- answer{res, err}
	}()
	var a answer
	select {
	case a = <-answered:
	case <-ctx.Done():
		select {
		case a = <-answered:
		case <-time.After(cancelGrace):
		}
	}
	// An answer complete before Ctrl-C took effect is an answer.
	if ctx.Err() != nil && (a.err != nil || a.res.Finish == "") {
		// The client is not closed: a node that did not confirm the
		// cancellation may hold its shutdown up, and exiting closes it.
		p.finish(p.printed())
		return interruptedError{}
	}
	c.Close()
	if a.err != nil {
		p.finish(p.printed())
		return a.err
	}
	p.rest(a.res.Text)
	p.finish(true)
	continued := ""
	if a.res.Continued > 0 {
		continued = fmt.Sprintf(", continuations through another router %d (%d tokens computed again)", a.res.Continued, a.res.Replayed)
	}
	if a.res.CachedTokens > 0 {
		continued += fmt.Sprintf(", %d prompt tokens read from the prefix cache", a.res.CachedTokens)
	}
	fmt.Fprintf(stderr, "%d tokens, finish %s, time to first token %s, total %s%s\n",
		len(a.res.Tokens), a.res.Finish, roundDuration(p.firstToken()), roundDuration(time.Since(p.start)), continued)
	return nil
}

// tokenPrinter writes the answer's text as it streams in: the node decodes
// the model's tokens and sends the text of each chunk, whole UTF-8
// characters only. On a terminal, control characters are written escaped
// (\x1b, not an escape sequence the terminal would obey): the text is the
// model's, and the model's is anyone's. The client calls token and text on
// its own goroutine; finish stops the printing, so that nothing is written
// after the line is ended.
type tokenPrinter struct {
	w      io.Writer
	start  time.Time
	escape bool

	mu     sync.Mutex
	first  time.Duration // since start; set by the first token
	tokens int
	wrote  int // bytes of the answer's text written, before escaping
	bytes  int // bytes written
	done   bool
	err    error // the first write error; later text is not written
}

func (p *tokenPrinter) token(int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.tokens == 0 {
		p.first = time.Since(p.start)
	}
	p.tokens++
}

func (p *tokenPrinter) text(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.write(s)
}

// rest writes what of the whole answer's text the stream held back: the
// bytes of an incomplete character at its end.
func (p *tokenPrinter) rest(answer string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wrote < len(answer) {
		p.write(answer[p.wrote:])
	}
}

func (p *tokenPrinter) write(s string) {
	if p.done || p.err != nil {
		return
	}
	p.wrote += len(s)
	if p.escape {
		s = escapeControls(s)
	}
	var n int
	n, p.err = io.WriteString(p.w, s)
	p.bytes += n
}

func (p *tokenPrinter) printed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bytes > 0
}

// escapeControls writes every control character of s but newline and tab
// (C0, DEL and C1) as a Go escape, and invalid UTF-8 as U+FFFD.
func escapeControls(s string) string {
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "\uFFFD") {
		switch {
		case r == '\n' || r == '\t':
			b.WriteRune(r)
		case r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0):
			q := strconv.QuoteRune(r)
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

func (p *tokenPrinter) firstToken() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.first
}

// finish ends the output, with a newline when asked.
func (p *tokenPrinter) finish(newline bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	if newline && p.err == nil {
		io.WriteString(p.w, "\n")
	}
}

func roundDuration(d time.Duration) time.Duration {
	return d.Round(100 * time.Microsecond)
}

// interruptedError is Ctrl-C: the request was cancelled and the process
// exits 130, as a shell reports a command killed by SIGINT.
type interruptedError struct{}

func (interruptedError) Error() string { return "interrupted; the request was cancelled" }
func (interruptedError) exitCode() int { return exitInterrupted }

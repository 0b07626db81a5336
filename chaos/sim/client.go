package sim

import (
	"fmt"
	"slices"
	"time"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/messages"
)

// client is one client request and its oracle: the reference answer, the
// tokens streamed so far, and how it ended; and the router's relay of its
// stream (handoff.Stream, the relay's own core): the decode node it hears,
// which a move hands over to another.
type client struct {
	w      *world
	id     uint64
	tenant string
	salt   string // the cache salt it sends
	prompt []int
	maxNew int
	want   []int // the reference answer, cut at EOS; nil when the context cannot hold the request
	cancel time.Duration

	node *node // the decode node the stream is on, and its run
	inc  uint64
	peer handoff.Peer
	fits bool // the routed path's smallest pool holds the request
	// dr is the request the stream is on (a move's target, once handed
	// over), origin the one the client's request was routed to, whose
	// prefill read what the answer reports as cached.
	dr, origin *dreq
	originInc  uint64 // origin's run
	stream     *handoff.Stream
	// deadline is when the relay gives up on a stream that moved:
	// RequestTimeout and a margin after the decode node admitted it.
	deadline time.Time

	emitted []int
	done    bool
	outcome string
}

// buildClients draws the workload: prompts of random lengths (some too long
// for their path, some shared by tenants, many starting with a prefix
// shared by every tenant, some the next turn of an earlier request's
// chat), cache salts, token budgets, arrival times and cancellations.
func (w *world) buildClients() {
	o := w.opt
	w.buildPrefixes()
	for i := range o.Requests {
		c := &client{w: w, id: uint64(i + 1), tenant: tenantName(w.rng.IntN(o.Tenants)), salt: salts[w.rng.IntN(len(salts))]}
		c.stream = handoff.NewStream(c.id, "")
		c.maxNew = 1 + w.rng.IntN(o.MaxTokensMax)
		switch {
		case i > 0 && w.rng.IntN(4) == 0:
			c.prompt = w.clients[i-1].prompt // the same prompt, perhaps of another tenant
		case w.chance(Oversize):
			c.prompt = w.prompt(w.oversize(c.maxNew))
		case i > 0 && w.rng.IntN(4) == 0:
			prev := w.clients[w.rng.IntN(i)]
			if c.prompt = w.followUp(prev); c.prompt != nil && w.rng.IntN(4) != 0 {
				c.tenant, c.salt = prev.tenant, prev.salt // the chat's next turn; else another's probe of it
			}
		}
		switch {
		case c.prompt != nil:
		case len(w.prefixes) > 0 && w.rng.IntN(4) != 0:
			c.prompt = w.sharedPrompt()
		default:
			c.prompt = w.prompt(1 + w.rng.IntN(o.PromptTokensMax))
		}
		c.want = w.reference(c.prompt, c.maxNew)
		if w.chance(Cancel) {
			c.cancel = w.between(0, 20*o.Timing.DecodeStep)
		}
		w.clients = append(w.clients, c)
		w.after(w.between(0, o.Timing.Arrivals), fmt.Sprintf("client %d (%s, salt %q) sends %d prompt tokens, max %d",
			c.id, c.tenant, c.salt, len(c.prompt), c.maxNew), c.route)
	}
	w.open = len(w.clients)
}

// oversize is a prompt length too long for some bound: the context window,
// the context with the tokens asked for, or the smallest prefill pool.
func (w *world) oversize(maxNew int) int {
	o := w.opt
	switch w.rng.IntN(3) {
	case 0:
		return o.ContextTokens + 1 + w.rng.IntN(8)
	case 1:
		return o.ContextTokens - w.rng.IntN(maxNew)
	}
	return o.PrefillPagesMin*o.PageTokens + 1 + w.rng.IntN(4*o.PageTokens)
}

func (w *world) prompt(n int) []int {
	p := make([]int, n)
	p[0] = engine.BOS
	for i := 1; i < n; i++ {
		p[i] = 'a' + w.rng.IntN(26)
	}
	return p
}

// reference is the single-node answer, cut at EOS, or nil when the
// context cannot hold the request.
func (w *world) reference(prompt []int, maxNew int) []int {
	if len(prompt)+maxNew > w.opt.ContextTokens {
		return nil
	}
	key := fmt.Sprint(maxNew, prompt)
	if ref, ok := w.refs[key]; ok {
		return ref
	}
	ref, err := w.engine.Reference(prompt, maxNew)
	if err != nil {
		w.fail("options", "reference of %d tokens: %v", len(prompt), err)
		return nil
	}
	if i := slices.Index(ref, engine.EOS); i >= 0 {
		ref = ref[:i+1]
	}
	w.refs[key] = ref
	return ref
}

// route is the router: a decode and a prefill node membership reports up,
// the admission rule against their pools, and the request sent to the
// decode node.
func (c *client) route() {
	w := c.w
	decodes, prefills := alive(w.decode), alive(w.prefill)
	if len(decodes) == 0 || len(prefills) == 0 {
		c.refused(handoff.Wire(handoff.NoNodes(len(decodes), len(prefills), "")))
		return
	}
	d := decodes[w.rng.IntN(len(decodes))]
	p := prefills[w.rng.IntN(len(prefills))]
	err := handoff.Admit(w.limits, len(c.prompt), c.maxNew, p.pagesN, d.pagesN)
	w.checkPath(c, p, d, err)
	if err != nil {
		w.count[OversizeRefused]++
		c.refused(handoff.Wire(err))
		return
	}
	c.node, c.inc, c.peer = d, d.inc, p.peer()
	c.stream = handoff.NewStream(c.id, d.addr)
	lat := w.opt.Timing.Latency
	w.after(lat, fmt.Sprintf("client %d reaches %s", c.id, d.addr), func() {
		if d.inc == 0 || d.inc != c.inc {
			c.nodeLost(fmt.Sprintf("decode node %s is not up", d.addr))
			return
		}
		d.admit(c)
	})
	if c.cancel > 0 {
		w.after(lat+c.cancel, fmt.Sprintf("client %d cancels", c.id), c.withdraw)
	}
}

// withdraw is the client's cancellation, on the same connection.
func (c *client) withdraw() {
	if c.done || c.dr == nil || c.node.inc != c.inc {
		return
	}
	c.dr.run(handoff.Cancel{})
}

// checkPath is the admission oracle: a request is admitted on a path (at
// routing, or for a retry with err nil) exactly when the context and the
// smallest pool on its path hold it: the prompt in prefill's pool, the
// prompt and every token it may generate in decode's. A refusal is a
// prompt_too_long.
func (w *world) checkPath(c *client, p, d *node, err error) {
	pt := w.opt.PageTokens
	pages := func(tokens int) int { return (tokens + pt - 1) / pt }
	fits := c.maxNew <= w.opt.MaxTokensMax && len(c.prompt)+c.maxNew <= w.opt.ContextTokens &&
		pages(len(c.prompt)) <= p.pagesN && pages(len(c.prompt))+pages(c.maxNew-1) <= d.pagesN
	c.fits = fits
	switch {
	case err == nil && !fits:
		w.fail("admission", "client %d (%d prompt tokens, %d more) was admitted on a path that cannot hold it: %s has %d pages, %s %d pages, of %d tokens; context %d",
			c.id, len(c.prompt), c.maxNew, p.addr, p.pagesN, d.addr, d.pagesN, pt, w.opt.ContextTokens)
	case err != nil && fits:
		w.fail("admission", "client %d (%d prompt tokens, %d more) was refused on a path that holds it (%s %d pages, %s %d pages): %v",
			c.id, len(c.prompt), c.maxNew, p.addr, p.pagesN, d.addr, d.pagesN, err)
	case err != nil && handoff.Wire(err).Code != messages.CodePromptTooLong:
		w.fail("typed errors", "client %d was refused with %v, want prompt_too_long", c.id, err)
	}
}

// heard is the relay's check that a message for the stream comes from the
// decode node it is on: what another node sends is refused (counted), what
// a node the stream left still sends is dropped.
func (c *client) heard(from string, id uint64) bool {
	ok, why := c.stream.From(from, id)
	if !ok && why != "" {
		c.w.count[RelayRefused]++
		c.w.trace.line(fmt.Sprintf("  relay of client %d refused: %s", c.id, why))
	}
	return ok
}

// chunk is the relay's taking of a chunk from the decode node at from: a
// chunk of the stream's node passes on in order (from 1, as package client
// counts them), and its tokens are checked against the reference.
func (c *client) chunk(from string, chunk *messages.TokenChunk) {
	w := c.w
	if !c.heard(from, chunk.RequestID) {
		return
	}
	if c.done {
		w.fail("answers", "client %d got token chunk %d after its request ended (%s)", c.id, chunk.Seq, c.outcome)
		return
	}
	if why := c.stream.Chunk(chunk.Seq); why != "" {
		w.fail("answers", "client %d: %s, from the node its stream is on", c.id, why)
		return
	}
	for _, t := range chunk.Tokens {
		at := len(c.emitted)
		if at >= len(c.want) || int(t) != c.want[at] {
			w.fail("answers", "client %d (%s) was streamed token %d at position %d; the reference answer is %v", c.id, c.tenant, t, at, c.want)
			return
		}
		c.emitted = append(c.emitted, int(t))
	}
}

// finish checks the request's answer, from the decode node at from: the
// reference exactly, with the tokens streamed, or a typed error with a
// stable code; never twice.
func (c *client) finish(from string, f handoff.Finish) {
	w := c.w
	res := f.Result
	if !c.heard(from, res.RequestID) {
		return
	}
	if err := res.Validate(); err != nil {
		w.fail("answers", "client %d got an invalid result: %v", c.id, err)
	}
	if f.Cause != nil {
		c.refused(res.Err)
		return
	}
	got := make([]int, len(res.Tokens))
	for i, t := range res.Tokens {
		got[i] = int(t)
	}
	switch {
	case c.done:
		w.fail("answers", "client %d got an answer after its request ended (%s)", c.id, c.outcome)
	case !slices.Equal(got, c.want) || !slices.Equal(f.Tokens, c.want):
		w.fail("answers", "client %d (%s) got the answer %v; the reference answer is %v", c.id, c.tenant, got, c.want)
	case !slices.Equal(c.emitted, c.want):
		w.fail("answers", "client %d was streamed %v, and answered %v", c.id, c.emitted, got)
	case c.origin != nil:
		c.checkCached(res.CachedTokens)
	}
	c.end("answered")
	w.count[Answered]++
}

// checkCached is the check of the cached tokens a result reports: those
// the prefill of the request's last attempt read through shared leases.
func (c *client) checkCached(got uint32) {
	dr := c.origin
	key := handoff.JobKey{Sender: senderKey(dr.n.addr, c.originInc), ID: dr.r.Owner().Request}
	if want, ok := c.w.cachedRead[key]; !ok || int(got) != want {
		c.w.fail("cached tokens", "client %d (%s) was told %d prompt tokens came from the cache; the prefill of its attempt %d read %d (prefilled %t)",
			c.id, c.tenant, got, key.ID, want, ok)
	}
}

// refused ends the request with an error, which must carry a stable code.
func (c *client) refused(e *messages.WireError) {
	w := c.w
	switch {
	case c.done:
		w.fail("answers", "client %d got an error (%v) after its request ended (%s)", c.id, e, c.outcome)
		return
	case e == nil || e.Code < messages.CodePromptTooLong || e.Code > messages.CodeUnavailable:
		w.fail("typed errors", "client %d failed without a stable error code: %v", c.id, e)
		return
	case e.Code == messages.CodeInternal || e.Code == messages.CodeBadRequest || e.Code == messages.CodeForbidden ||
		e.Code == messages.CodeModelMismatch:
		// The workload's requests are valid and their own tenant's: no
		// fault explains these (internal is a bug by its definition).
		w.fail("typed errors", "client %d failed with %s, which no fault explains: %v", c.id, e.Code, e)
		return
	case e.Code == messages.CodePromptTooLong && c.fits:
		w.fail("admission", "client %d was refused as too long by its decode node on a path that holds it: %v", c.id, e)
	}
	switch e.Code {
	case messages.CodeIntegrity:
		w.count[IntegrityRefused]++
	case messages.CodeBusy:
		w.count[BusyRefused]++
	}
	w.count[Failed]++
	c.end(e.Code.String())
}

// nodeLost ends the request when its decode node's run is gone: the
// client's connection broke.
func (c *client) nodeLost(why string) {
	if c.done {
		return
	}
	c.w.trace.line(fmt.Sprintf("  client %d: connection lost: %s", c.id, why))
	c.refused(&messages.WireError{Code: messages.CodeNodeLost, Message: why})
}

func (c *client) end(outcome string) {
	c.done, c.outcome = true, outcome
	c.w.open--
}

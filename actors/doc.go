// Package actors serves generation inside one node, disaggregated across
// its own prefill and decode workers, with protoactor-go actors wrapping the
// pure cores of kv, handoff and gpu. The admission, request and worker
// actors are shells: the rules of a request's life, of a prefill worker's
// transfers and of admission are handoff's state machines (the same ones
// the simulator in chaos/sim drives), and the actors turn messages and
// timers into their events and carry their effects out.
//
// # Common path
//
// Start builds a Node: for each worker, one page actor per physical page
// (each owns one kv.Page), a pool actor (owns the kv.FreeList: reservations
// all or nothing) and a GPU-worker actor (owns the engine and runs prefill
// jobs and decode steps interleaved: continuous batching, BatchMax
// sequences a step); and the admission actor. A client's GenerateRequest
// reaches admission, which refuses, before any page is reserved or any
// frame sent, a prompt that (with its max_tokens) exceeds the context window
// or the smallest pool on its path, and answers "busy" when QueueMax
// requests are in flight. An admitted request gets a request actor, which:
// reserves decode pages (retrying an exhausted pool until ReserveWait, then
// "busy"); sends the prefill worker a plan naming those tags and the exact
// prompt; accepts the frames prefill streams in bounded batches only into
// its own pages, and only from the prefill node and incarnation it planned
// with (checksum, destination tag, owner, tenant and position are all
// checked); seals every page only if its bytes are those prefill sealed
// (prefill's seal checksums come in its TransferDone) and verifies the
// manifest; acknowledges, upon which prefill releases its source pages;
// hands the verified manifest to the decode worker, which recomputes
// prefill's first token from the KV before it streams it; streams tokens to
// the client, as their sender; and, however the request ends, releases
// every page it holds.
//
// A prefill worker keeps the full pages of the prompts it computed as a
// prefix cache (handoff.PrefixCache, at most PrefixCachePercent of its
// pool) and computes, of a later prompt of the same scope, only what
// follows the pages it holds; with several prefill workers the dispatcher
// hands a plan to the one its prefix went to (PrefixRouting). A decode
// worker keeps the full pages of the prompts it answered (at most
// DecodeCachePercent of its pool): a request asks it for the run it holds,
// copies those pages into its own, and asks prefill for the rest only.
//
// A prefill worker takes plans only from nodes that decode, and sends their
// KV only to the data plane membership gives for the planner
// (Options.DataPlaneOf), from a goroutine per transfer (TransferSendsMax at
// once), so that a slow or silent peer holds up only its own transfer. A
// plan that ended is remembered (DonePlansMax, for PrefillTimeout), so a
// duplicate is not prefilled again.
//
// # Ownership and concurrency
//
// A page changes owner, is written and is leased only by messages to its
// page actor, one at a time. The engine reads a leased page's bytes
// directly (in the worker's goroutine): sealed bytes do not change while a
// lease is held, and every read checks the page's generation, which its
// page actor publishes atomically, so a page reclaimed under a lease is
// refused, never read. Actors call one another with bounded futures
// (CallTimeout); no call cycle exists (pages and pools answer, they never
// ask; a request asks its decode worker, which asks only pages), so none
// can deadlock. Mailboxes never make a sender wait
// (NewMailbox): at MailboxMax, what may come from outside is dropped,
// counted, and answered "busy" when it expects an answer, while the node's
// own internal messages, bounded by its other limits, still get in. The
// pool actor's mailbox is unbounded: page actors send it every free while
// it sends them assignments, and its content is bounded by the page count
// and the requests in flight. Every owned page has a deadline
// (OwnedPageTimeout) at which its page actor reclaims it, so an owner that
// dies without releasing strands nothing.
//
// A transfer attempt is a request id: a retry takes a new one, so frames,
// TransferDone and tokens of an abandoned attempt are told apart, dropped
// and counted, never mixed into the answer. A reservation whose answer
// comes too late is undone by the pool actor, which handles messages in
// order.
//
// # Supervision
//
// protoactor's default supervision restarts a panicking actor with fresh
// state while the pages it managed stay allocated. Here every actor is
// supervised by stopOnPanic: a panic is a broken invariant, the actor is
// stopped, and the node reports an InvariantError (Node.Fatal) and must not
// serve on. Expected failures are returned errors, never panics.
package actors

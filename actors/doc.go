// Package actors serves generation inside one node, disaggregated across
// its own prefill and decode workers, with protoactor-go actors wrapping the
// pure cores of kv and gpu.
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
// its own pages (checksum, destination tag, owner, tenant and position are
// all checked); seals every page and verifies the manifest; acknowledges,
// upon which prefill releases its source pages; hands the verified manifest
// to the decode worker; streams tokens to the client; and, however the
// request ends, releases every page it holds.
//
// # Ownership and concurrency
//
// A page changes owner, is written and is leased only by messages to its
// page actor, one at a time. The engine reads a leased page's bytes
// directly (in the worker's goroutine): sealed bytes do not change while a
// lease is held. Actors call one another with bounded futures (CallTimeout);
// no call cycle exists (pages and pools answer, they never ask), so none can
// deadlock. Every mailbox is bounded (MailboxMax): a sender to a full one
// waits.
//
// # Supervision
//
// protoactor's default supervision restarts a panicking actor with fresh
// state while the pages it managed stay allocated. Here every actor is
// supervised by stopOnPanic: a panic is a broken invariant, the actor is
// stopped, and the node reports an InvariantError (Node.Fatal) and must not
// serve on. Expected failures are returned errors, never panics.
package actors

// Package cluster turns separate node processes into one cluster: who is in
// it, in which role, at which addresses, with how much free KV pool
// (package membership), and the data plane, routing and wiring between
// the nodes (described here and in their own files).
//
// # KV data plane
//
// The data plane carries KV pages between nodes as kv frames in bounded
// batches over TLS 1.3 with client certificates (plain TCP when the node is
// insecure), beside the actor system that carries control messages. A
// sender (DialDataPlane) opens one connection to a receiver, checks in the
// handshake that the receiver is the node that planned the transfer
// (before writing a byte), names in a versioned hello the incarnation it
// expects, and is refused if the receiver has restarted since, because its
// destination tags are stale. The receiver serves only certificates whose
// role prefills, hands every batch on with the sender's identity
// (DataPlaneBatch.Peer) so that frames are taken only from the prefill
// node planned, and bounds strangers: HelloTimeout for the handshake and
// hello, HandshakesMax connections before their hello (which hold no
// serving slot), of them HandshakesPerAddrMax from one stranger's IP and
// all but HandshakesReserved from strangers together (the reserve is for
// addresses a node connected from lately, so that a restarted prefill
// node gets in while strangers hold every slot they may),
// ConnectionsPerPeerMax of ConnectionsMax per identity (per
// IP when insecure). Send packs frames into batches within kv.BatchLimits,
// with at most InFlightMax unacknowledged per connection (back-pressure),
// and returns only when the receiver's handler has accepted every frame,
// or with a typed refusal or a lost connection; payloads go on the wire
// from where they lie (writev over TCP; over TLS a batch's records are
// gathered into large writes), not copied behind their headers. The
// receiver (ListenDataPlane) reads into two buffers per connection
// allocated at hello, the next batch while the handler runs on the current
// one, decodes each with kv.DecodeBatch, refuses any batch with a frame
// addressed to another incarnation, and hands the rest to its handler,
// which does the page writes; acknowledgements go back in order. A batch
// refused for any reason (malformed bytes, another incarnation, the page
// checks) is acknowledged as such and closes its connection, counted in
// the node's trust.Authority. Sends are safe from several goroutines; the
// handler runs on one goroutine per connection and must copy what it
// keeps. A lost connection is final: the owner dials again.
//
// # Nodes, routing and drain
//
// StartNode runs one member: the actors of its role (actors.Start), the
// data plane for roles that receive KV, membership with its metadata (free
// pages republished every MetaInterval), and a control actor answering
// StatusRequest and DrainRequest, and ListInFlight and CancelInFlight
// through the actor that holds the requests in flight (the router, or
// admission), which answers the operator itself. A router node's admission
// is the router actor: it refuses a request that does not fit the context
// window or the smallest pool on the path it would take (from the members'
// metadata), then forwards it to the alive, non-draining decode node with
// the most free pages, with the prefill node with the most free pages
// chosen for it, keeping the client as the sender so tokens stream from the
// decode node straight to the client. A decode node plans each transfer
// with a prefill node and, if that transfer fails before any token was
// streamed (the prefill node died, refused or timed out), plans it again
// with another. Membership events tell the actors which peers are gone:
// transfers planned with a lost prefill node are retried, a router
// answers "node lost" to the clients of a lost decode node, and a decode
// node cancels the requests a lost router relayed before it went missing.
// A member that failure detection declares dead is lost at once only when
// its remote address refuses a connection (its process is gone) or another
// run, verified, serves it (a restart on the same port); one whose address
// still completes a handshake (stopped, paused) or does not answer keeps
// its requests for NodeConfig.LostAfter, gets no new work meanwhile, and
// finishes them if it comes back within the bound (absences decides; the
// watch loop dials and tells the actors). Drain marks the node draining in
// its metadata (routers skip it; its admission answers busy), waits until
// what it has in flight is done, then leaves gracefully; no admitted
// request is aborted by a drain.
package cluster

// Package cluster turns separate node processes into one cluster: who is in
// it, in which role, at which addresses, with how much free KV pool
// (membership, described here), and the data plane, routing and wiring
// between the nodes (described in their own files).
//
// # Membership
//
// Membership wraps hashicorp/memberlist (SWIM gossip with the Lifeguard
// extensions). The common path:
//
//	cfg := cluster.DefaultConfig()           // or DefaultLocalConfig() in tests
//	cfg.JoinAddrs = []string{"10.0.0.1:7946"}
//	m, err := cluster.Start(cfg, cluster.Meta{Role: cluster.RoleDecode,
//		Incarnation: inc, RemoteAddr: remote, DataAddr: data,
//		CapacityPages: pages, FreePages: pages})
//	go func() {
//		for ev := range m.Events() { /* route by ev.Kind and ev.Member.Meta */ }
//	}()
//	...
//	_ = m.UpdateMeta(meta)   // free pages changed, or draining
//	_ = m.Leave(5 * time.Second)
//	_ = m.Shutdown()
//
// A node's metadata (Meta) is small, binary, versioned and validated on
// both ends: EncodeMeta refuses what DecodeMeta would refuse, and its
// worst case (MetaEncodedLenMax, both addresses at AddrLenMax) stays under
// memberlist.MetaMaxSize, beyond which memberlist panics. Start and
// UpdateMeta refuse oversized or malformed metadata with the numbers.
//
// # Identity
//
// A member's name is NodeName(prefix, incarnation), and the incarnation is
// chosen anew at every node start, so a restarted node is a new member and
// never its old self. Two runs claiming the same gossip, remote or data
// address cannot both be alive: without verification (see Trust) the
// later start (Meta.StartedUnixMilli, then the incarnation) is kept and the
// other is reported as EventFail "superseded" at once, without waiting for
// failure detection. A member
// whose metadata does not decode, or does not match its name, is counted
// (Stats), logged and kept out of Members and Events; it never stops the
// node.
//
// # Trust
//
// Gossip is sealed with the cluster's keyring (Config.Keys: AES-GCM,
// nothing unsealed accepted or sent), so a process without the key can
// neither join nor be heard; Config.Keys describes rotation. Every node
// holds the key, so a member's metadata is still only a claim: a member
// is listed Verified once this node has dialed each address it claims and
// found there, in a TLS handshake, a certificate of the cluster whose
// identity has the member's role and whose name is the member name less
// its incarnation (a secure member's NamePrefix is its identity's name).
// One goroutine per Membership does the probing, a bounded number at a
// time, retrying with a doubling wait; results are kept per run. Routers
// pick only verified members, and only verified members compete for
// addresses; since a start time or an incarnation is claimed, not proven,
// the run verified first keeps an address while it lives, and a later run
// of the same node waits until it leaves or is declared dead.
// Config.Insecure (`--insecure`) skips verification: every member is
// listed Verified.
//
// # Concurrency
//
// Membership's methods may be called from any goroutine. memberlist calls
// the package's delegate from its own goroutines (packet and stream
// handlers, the probe and gossip timers), mostly while it holds its node
// lock; the delegate therefore never calls back into memberlist, and
// neither does any code holding Membership's table lock. The delegate
// updates the member table and hands events to the Events channel without
// blocking: when the channel is full the event is dropped and counted,
// because stalling the callback would stall failure detection for the
// whole node. A consumer that sees Stats().EventsDropped grow resyncs from
// Members, which is kept from the same notices. UpdateMeta, Join, Leave
// and Shutdown are serialized with one another (each bounded by its
// timeout); Members, Meta and Stats never wait for them. Shutdown closes
// Events; no event is sent after it.
//
// # Invariants
//
//   - Local metadata handed to memberlist is never longer than
//     memberlist.MetaMaxSize (checked at build, test, Start and UpdateMeta).
//   - A name stands for one run: its metadata's incarnation matches it, and
//     a run's incarnation and role never change.
//   - Members never lists a member whose metadata was refused or that was
//     superseded; every member it lists got an EventJoin before (unless it
//     was dropped) and gets one EventLeave or EventFail when it goes.
//   - No memberlist call is made after Shutdown.
//
// memberlist reports a graceful leave and a failure through the same
// callback and keeps suspicion internal, so Leave gossips Meta.Leaving
// before leaving, and members are reported alive until declared dead.
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

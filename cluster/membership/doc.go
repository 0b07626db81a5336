// Package membership is who is in a kvwarden cluster, in which role, at
// which addresses, with how much free KV pool, and which of those members
// are proven to be the runs they claim.
//
// Membership wraps hashicorp/memberlist (SWIM gossip with the Lifeguard
// extensions). The common path:
//
//	cfg := membership.DefaultConfig()           // or DefaultLocalConfig() in tests
//	cfg.JoinAddrs = []string{"10.0.0.1:7946"}
//	m, err := membership.Start(cfg, membership.Meta{Role: membership.RoleDecode,
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
// holds the key, so a member's metadata is still only a claim, and a
// certificate names a node, never a run of it: a member is listed
// Verified once the node at its remote address has answered this node's
// run challenge (trust.AskRun: a nonce over mutually authenticated TLS)
// with the member's incarnation, under a certificate of the cluster whose
// identity has the member's role and whose name is the member name less
// its incarnation (a secure member's NamePrefix is its identity's name),
// and its data address served that certificate. A holder of the gossip
// key announcing a real node's name and addresses is answered another
// incarnation, and is never verified, whether that node runs, crashed or
// restarted. One goroutine per Membership starts the probes, a bounded
// number at a time, a run's first probe ahead of every retry, retrying
// with a doubling wait; results are kept per run. Routers pick only
// verified members. When a run is proven at an address, every run proven
// there earlier is superseded (EventFail): a restart on the same ports is
// verified, and its predecessor dropped, within one challenge.
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
//   - Members never lists a member whose metadata was refused, nor one
//     superseded (a run that gossips again after that is listed anew,
//     unverified until proven); every member it lists got an EventJoin
//     before (unless it was dropped) and gets one EventLeave or EventFail
//     when it goes.
//   - Verified is given only by a proof of the run (this member and
//     Insecure aside), and at most one verified member holds an address:
//     the one whose run answered there last.
//   - No memberlist call is made after Shutdown.
//
// memberlist reports a graceful leave and a failure through the same
// callback and keeps suspicion internal, so Leave gossips Meta.Leaving
// before leaving, and members are reported alive until declared dead.
package membership

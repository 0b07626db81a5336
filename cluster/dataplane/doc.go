// Package dataplane carries KV pages between nodes.
//
// The data plane carries KV pages between nodes as kv frames in bounded
// batches over TLS 1.3 with client certificates (plain TCP when the node is
// insecure), beside the actor system that carries control messages. A
// sender (Dial) opens one connection to a receiver, checks in the
// handshake that the receiver is the node that planned the transfer
// (before writing a byte), names in a versioned hello the incarnation it
// expects, and is refused if the receiver has restarted since, because its
// destination tags are stale. The receiver serves only certificates whose
// role prefills, hands every batch on with the sender's identity
// (Batch.Peer) so that frames are taken only from the prefill
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
// receiver (Listen) reads into two buffers per connection
// allocated at hello, the next batch while the handler runs on the current
// one, decodes each with kv.DecodeBatch, refuses any batch with a frame
// addressed to another incarnation, and hands the rest to its handler,
// which does the page writes; acknowledgements go back in order. A batch
// refused for any reason (malformed bytes, another incarnation, the page
// checks) is acknowledged as such and closes its connection, counted in
// the node's trust.Authority. Sends are safe from several goroutines; the
// handler runs on one goroutine per connection and must copy what it
// keeps. A lost connection is final: the owner dials again.
package dataplane

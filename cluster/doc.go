// Package cluster turns separate node processes into one cluster: who is in
// it, in which role, at which addresses, with how much free KV pool
// (package membership), and the data plane, routing and wiring between
// the nodes (described here and in their own files).
//
// # KV data plane
//
// The data plane carries KV pages between nodes as kv frames in bounded
// batches (package dataplane). A node listens on it when its role
// receives KV, and dials it for a planned transfer only to the data plane
// a verified member of the plan's incarnation advertises (dialPlanned).
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

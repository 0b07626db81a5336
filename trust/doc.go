// Package trust is kvwarden's trust model: who a peer is, proven by a
// certificate from the cluster CA, and what it may send.
//
// Every node, operator and client holds a certificate whose URI SAN names
// it: kvwarden://<cluster>/<role>/<name>, where role is a node role
// (prefill, decode, router, all), operator, or tenant (the name is then
// the tenant). NewCA and CA.Issue make them (`node certs`); Load reads a
// Bundle of CA, certificate, key and gossip keyring from a directory.
//
// An Authority carries a process's Bundle into every transport: protoactor
// remote (ServerOptions, DialOptions: mutual TLS 1.3 and a guard on every
// inbound stream), the KV data plane (Bundle.ServerTLS, Bundle.ClientTLS)
// and gossip (the keyring). Host names are not checked; addresses are
// bound by proof instead: the address book (Peers) records, for each
// host:port, the certificate that answered a TLS handshake this process
// started, and a peer that claims a protoactor address is believed only if
// the certificate it presented is the one found there. The stream guard
// binds each inbound stream to one checked address, refuses every batch
// with an out-of-range index, a type other than ours, a sender at another
// address or a target elsewhere, names the peer as the sender of what came
// without one, and recovers a panic in
// protoactor's reader, so that one peer's bytes cannot kill the process.
// Actors then ask Authority.Of(ctx) who sent a message and check its role,
// tenant and (for transfers and answers) that it is the peer planned.
//
// Insecure gives an authority that authenticates nobody: an explicit
// choice (`--insecure`) that the node logs and reports in status.
//
// An Authority is safe for concurrent use; refusals are counted by kind
// (Refused) and logged.
package trust

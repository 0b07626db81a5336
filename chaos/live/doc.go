// Package live runs chaos campaigns against real clusters: a seeded
// multi-tenant workload sent while a seeded schedule of faults is
// injected into real node processes, with every answer checked against
// the reference engine and every pool read once the cluster is quiet.
// "node chaos" is its command.
//
// # Common path
//
// A Campaign holds a Config (seed, requests, concurrency, WorkloadConfig,
// ScheduleConfig, timeouts), one client per tenant, a Cluster to read
// (node list and status) and the Controls it may use: Processes (kill -9,
// restart on the same addresses, SIGSTOP/SIGCONT), a Network of toxiproxy
// proxies in front of every node's TCP ports (latency, bandwidth, resets,
// partitions), a Holder of pool pressure and a RoguePeer. Run sends the
// Workload's requests while an injector carries out the Schedule's
// faults, then lets the cluster settle, reads every pool until every page
// is free or the quiesce timeout passes, sends each tenant a probe and
// returns a Report: a summary table (WriteSummary), JSON (WriteJSON) and
// a PNG of latency and outcome over time with the fault windows
// (WritePlot). Report.Violations lists what must never happen and did:
// wrong answers, cross-tenant bytes, leaked pages, crashes, attacks not
// refused and counted, a cluster that did not recover.
//
// # Determinism
//
// Every random choice comes from the one seed, in streams of its own: the
// Workload's request i and the Schedule's fault n are the same for the
// same seed and configuration, whatever else happened, so a seed replays
// a campaign's inputs. What the cluster does with them (timing, which
// request a kill catches) is the system under test and is not replayed.
//
// # The checker
//
// Prompts are ASCII and carry their tenant's canary, so a prompt's bytes
// are its tokens and every tenant's prompts differ. The Checker computes
// each distinct prompt's reference once with the most tokens a request
// may ask for; a request's reference is its first MaxTokens, ended at the
// first stop token as engine.Model.Answer ends it. A streamed token or an answer that is
// not the reference's is wrong, and when it is another prompt's reference
// the checker says whose: another tenant's (cross-tenant) or the same
// tenant's (cross-request). Oversize prompts must be refused with
// prompt_too_long and are wrong if answered. Errors are classified by
// their stable code (messages.ErrorCode). A chaos build's nodes count the
// rows their reads returned that another tenant or request wrote; those
// counts, summed over every incarnation read (a node about to be killed
// is read first), must be zero.
//
// # Concurrency
//
// Run sends from Config.Concurrency goroutines and injects each fault on
// its own, one fault at a time per node; the Checker, the tally of
// outcomes and the injector's log are safe for concurrent use. Network
// and RoguePeer are safe for concurrent use; a Schedule and a Workload's
// construction are not, a Workload once made is.
package live

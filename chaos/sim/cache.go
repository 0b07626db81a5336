package sim

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvwarden/kvwarden/engine"
	"github.com/kvwarden/kvwarden/handoff"
	"github.com/kvwarden/kvwarden/kv"
	"github.com/kvwarden/kvwarden/tenancy"
)

// The prefix caches of the prefill nodes. Each prefill run has a
// handoff.PrefixCache over its pool (of PrefixCachePercent of its pages),
// which scopes a plan by the world's tenancy.Policy: each tenant is drawn
// into one cache group or left alone. The oracle keeps its own account of
// that policy (groups) and, from the client each attempt serves, of the
// scope every plan's prefill runs under (job.scope): the policy's code is
// under test, so the oracle does not ask it.

// cacheGroup is the one group tenants of a world may share a cache in.
const cacheGroup = "shared"

// tenantName is the i-th tenant of a world.
func tenantName(i int) string { return fmt.Sprintf("tenant-%c", 'a'+i) }

// buildPolicy draws which tenants share a cache scope, and the policy that
// says so.
func (w *world) buildPolicy() {
	w.groups = map[string]string{}
	w.policy = tenancy.DefaultPolicy()
	w.policy.Tenants = map[string]tenancy.Share{}
	for i := range w.opt.Tenants {
		if w.rng.IntN(2) == 0 {
			t := tenantName(i)
			w.groups[t] = cacheGroup
			w.policy.Tenants[t] = tenancy.Share{CacheScope: cacheGroup}
		}
	}
	w.byAttempt = map[handoff.JobKey]*client{}
	w.forged = map[handoff.JobKey]bool{}
	w.cachedRead = map[handoff.JobKey]int{}
}

// scopeName is the oracle's account of whose cached pages a request of
// tenant with cache salt may read: those of its group's requests, if the
// world put its tenant in one, else its tenant's; narrowed to requests
// with the same salt when it has one.
func (w *world) scopeName(tenant, salt string) string {
	s := "tenant " + tenant
	if g := w.groups[tenant]; g != "" {
		s = "group " + g
	}
	if salt != "" {
		s += " salt " + salt
	}
	return s
}

// describeGroups names the tenants in the cache group, for the trace.
func (w *world) describeGroups() string {
	var in []string
	for i := range w.opt.Tenants {
		if t := tenantName(i); w.groups[t] != "" {
			in = append(in, t)
		}
	}
	return fmt.Sprintf(" cache group %s: %s", cacheGroup, strings.Join(in, ","))
}

// salts are the cache salts a client may send: mostly none, so that
// scopes are shared, sometimes one, so that a tenant's scope is narrowed
// and one salt is sent by several tenants.
var salts = []string{"", "", "", "s1"}

// buildPrefixes draws the prompt prefixes the workload shares: each of one
// to three full pages and a little more, the BOS first.
func (w *world) buildPrefixes() {
	pt := w.opt.PageTokens
	if w.opt.PromptTokensMax < 2 {
		return // no room for a suffix
	}
	for range w.opt.Prefixes {
		n := min(pt*(1+w.rng.IntN(3))+w.rng.IntN(pt), w.opt.PromptTokensMax-1)
		w.prefixes = append(w.prefixes, w.prompt(max(n, 1)))
	}
}

// sharedPrompt is one of the shared prefixes and a suffix of its own.
func (w *world) sharedPrompt() []int {
	p := w.prefixes[w.rng.IntN(len(w.prefixes))]
	suffix := 1 + w.rng.IntN(w.opt.PromptTokensMax-len(p))
	return append(slices.Clone(p), w.prompt(suffix + 1)[1:]...)
}

// followUp is the next turn of an earlier request's chat: its prompt, its
// answer (up to EOS) and a few tokens more, or nil when that is longer
// than a prompt may be.
func (w *world) followUp(prev *client) []int {
	if prev.want == nil {
		return nil
	}
	answer := prev.want
	if i := slices.Index(answer, engine.EOS); i >= 0 {
		answer = answer[:i]
	}
	p := append(slices.Concat(prev.prompt, answer), w.prompt(2 + w.rng.IntN(4))[1:]...)
	if len(p) > w.opt.PromptTokensMax {
		return nil
	}
	return p
}

// newCache is a run's empty prefix cache: a prefill run's, if the world
// runs them, or a decode run's, if the node holds prefixes. Both scope
// by the world's policy, as a node's workers do by its tenants file.
func (n *node) newCache() *handoff.PrefixCache {
	w := n.w
	percent := w.opt.PrefixCachePercent
	if n.role == roleDecode {
		percent = 0
		if n.holds {
			percent = w.opt.DecodeCachePercent
		}
	}
	if percent == 0 {
		return nil
	}
	c, err := handoff.NewPrefixCache(n.pagesN*percent/100, simModel.String(), w.policy.CacheScope)
	if err != nil {
		w.fail("options", "prefix cache of %s (%d pages, %d%%): %v", n.addr, n.pagesN, percent, err)
	}
	return c
}

// prefixKey names the first tokens of a prompt in the published record.
func prefixKey(tokens []int) string { return fmt.Sprint(tokens) }

// probes says whether a lookup of prompt in scope (the oracle's name)
// starts with a prefix another scope published on this run: a lookup
// across scopes, which must miss.
func (n *node) probes(prompt []int, scope string) bool {
	pt := n.w.opt.PageTokens
	for end := pt; end < len(prompt); end += pt {
		for _, s := range n.published[prefixKey(prompt[:end])] {
			if s != scope {
				return true
			}
		}
	}
	return false
}

// publishedBy records that the page c, published from a page of prompt
// (a prefill job's source page, or a decode request's prompt page), holds
// prompt up to its end under scope.
func (n *node) publishedBy(prompt []int, scope string, c kv.CachedPage) {
	key := prefixKey(prompt[:c.First+c.Tokens])
	if !slices.Contains(n.published[key], scope) {
		n.published[key] = append(n.published[key], scope)
	}
}

// promptScope is the prompt and the oracle's scope of the request owner
// names on this run: a prefill job's, or on a decode run those of the
// client the attempt serves.
func (n *node) promptScope(o kv.Owner) ([]int, string, bool) {
	if n.role == rolePrefill {
		j := n.jobs[o.Request]
		if j == nil {
			return nil, "", false
		}
		return j.prompt, j.scope, true
	}
	c := n.w.byAttempt[handoff.JobKey{Sender: senderKey(n.addr, n.inc), ID: o.Request}]
	if c == nil || c.tenant != o.Tenant {
		return nil, "", false
	}
	return c.prompt, n.w.scopeName(c.tenant, c.salt), true
}

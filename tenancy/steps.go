package tenancy

// ChooseSteps chooses which of a decode worker's sequences it steps in one
// batch of at most n when it has more than n, so that tenants share the
// worker by weight instead of by how many sequences each has: a tenant
// flooding with sequences gets no more steps than its weight says while
// another tenant has sequences waiting. tenants[i] is sequence i's tenant.
// The batch is shared by weighted max-min fairness: each tenant gets its
// weight's part of the slots left (weight(tenant), at least 1), at most
// as many as it has sequences, and what a tenant cannot use goes to the
// others by the same rule; slots too few to part by weight go one each to
// tenants in the order they first appear. Within a tenant, sequences go in
// their order, so a caller that rotates its sequences between batches
// steps each of a tenant's in turn, and changes who gets those last
// slots. It appends the indexes chosen to out and returns it; every
// sequence is chosen when there are at most n.
func ChooseSteps(tenants []string, weight func(string) int, n int, out []int) []int {
	if len(tenants) <= n {
		for i := range tenants {
			out = append(out, i)
		}
		return out
	}
	var order []string
	queues := map[string][]int{}
	for i, t := range tenants {
		q, ok := queues[t]
		if !ok {
			order = append(order, t)
		}
		queues[t] = append(q, i)
	}
	take := func(t string, k int) {
		q := queues[t]
		out = append(out, q[:k]...)
		queues[t] = q[k:]
		n -= k
	}
	for n > 0 {
		// The tenants with sequences left: there are some, since there
		// were more sequences than slots.
		active, total := order[:0:0], 0
		for _, t := range order {
			if len(queues[t]) > 0 {
				active = append(active, t)
				total += max(weight(t), 1)
			}
		}
		slots, gave := n, 0
		for _, t := range active {
			k := min(slots*max(weight(t), 1)/total, len(queues[t]))
			take(t, k)
			gave += k
		}
		if gave > 0 {
			continue
		}
		for _, t := range active {
			if n == 0 {
				break
			}
			take(t, 1)
		}
	}
	return out
}

//go:build mutant_lease_count_negative

package mutant

// Active is the mutant this build carries.
const Active = LeaseCountNegative

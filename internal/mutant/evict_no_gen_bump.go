//go:build mutant_evict_no_gen_bump

package mutant

// Active is the mutant this build carries.
const Active = EvictNoGenBump

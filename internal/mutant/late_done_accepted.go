//go:build mutant_late_done_accepted

package mutant

// Active is the mutant this build carries.
const Active = LateDoneAccepted

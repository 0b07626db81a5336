//go:build mutant_early_release

package mutant

// Active is the mutant this build carries.
const Active = EarlyRelease

//go:build mutant_held_copy_unchecked

package mutant

// Active is the mutant this build carries.
const Active = HeldCopyUnchecked

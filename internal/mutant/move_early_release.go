//go:build mutant_move_early_release

package mutant

// Active is the mutant this build carries.
const Active = MoveEarlyRelease

//go:build mutant_move_replay

package mutant

// Active is the mutant this build carries.
const Active = MoveReplay

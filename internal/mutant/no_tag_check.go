//go:build mutant_no_tag_check

package mutant

// Active is the mutant this build carries.
const Active = NoTagCheck

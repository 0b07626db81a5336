//go:build mutant_key_without_scope

package mutant

// Active is the mutant this build carries.
const Active = KeyWithoutScope

//go:build mutant_scope_from_request

package mutant

// Active is the mutant this build carries.
const Active = ScopeFromRequest

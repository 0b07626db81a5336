//go:build mutant_relay_unhanded

package mutant

// Active is the mutant this build carries.
const Active = RelayUnhanded

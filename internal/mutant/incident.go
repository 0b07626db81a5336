//go:build mutant_incident

package mutant

// Active is the mutant this build carries.
const Active = Incident

//go:build mutant_admit_ignores_smallest_pool

package mutant

// Active is the mutant this build carries.
const Active = AdmitIgnoresSmallestPool

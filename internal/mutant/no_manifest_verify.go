//go:build mutant_no_manifest_verify

package mutant

// Active is the mutant this build carries.
const Active = NoManifestVerify

//go:build !mutant_incident && !mutant_no_tag_check && !mutant_early_release && !mutant_no_gen_bump && !mutant_checksum_skips_header && !mutant_no_manifest_verify && !mutant_admit_ignores_smallest_pool && !mutant_late_done_accepted && !mutant_scope_from_request && !mutant_evict_no_gen_bump && !mutant_lease_count_negative && !mutant_key_without_scope && !mutant_held_copy_unchecked && !mutant_move_early_release && !mutant_move_replay && !mutant_relay_unhanded

package mutant

// Active is the mutant this build carries: none.
const Active = ""

"""The catalogue of invariants: one entry per behaviour a replay buffer must
have, the conformance properties that check it, the historic mutants that
must fail those properties and the public issues behind it.

This is the one place these facts live. The rules that read them:

* a known-failures entry or an expected failure may not name a property of a
  *seed* invariant (:func:`seed_invariant_of`);
* ``docs/coverage.md`` (its table) and the README's list of seed invariants
  are generated from it (``python -m rbcheck.harness.invariants``) and a test
  checks they are current;
* a test checks that every property named here exists, that every
  conformance property belongs to an invariant, and that every mutant named
  here exists and targets one of its invariant's properties.

A property is named by its id, ``<file stem>::<test>`` (``rbcheck list``);
``[param]`` after it names one parametrization. Mutants are named by factory;
they live in the repository, not in the installed package.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass


@dataclass(frozen=True)
class Invariant:
    id: str
    statement: str
    properties: tuple[str, ...] = ()
    mutants: tuple[str, ...] = ()  # historic mutants: each modelled on one of real_bugs
    real_bugs: tuple[str, ...] = ()
    seed: int | None = None  # 1..5: a seed invariant (no known failure may hide it)
    number: int | None = None  # its number in the catalogue of real bugs
    why_uncovered: str = ""  # for an entry without properties


PT, CR, PM, PP = "test_priority_transform", "test_checkpoint_roundtrip", "test_pin_memory", "test_policy_placement"
SS, RE, CH = "test_sampled_slots", "test_ring_eviction", "test_checkpoint_chain"
SD, TS = "test_sampling_distributions", "test_trajectory_slices"
BI, CF, CC = "test_bad_input", "test_checkpoint_faults", "test_concurrency"
TR = "test_transitions"
OW, SM = "test_ownership", "test_sampling_mass"
MODEL = "test_model_comparison::test_implementation_matches_reference_model"
LIVE = f"{SS}::test_sampled_slots_are_live_and_weights_belong_to_them"

CATALOGUE: tuple[Invariant, ...] = (
    Invariant(
        "checkpoint_exact", seed=1,
        statement="save → load round-trips exactly, including the prioritized sampler's state (max "
        "priority with its type, both trees), the writer's cursor, count and generations, and the "
        "generator, so the next samples are identical; metadata is plain JSON and no file is a pickle",
        properties=(f"{CR}::test_save_load_round_trips_exactly", f"{CR}::test_checkpoint_metadata_is_plain_json",
                    f"{CR}::test_checkpoint_holds_no_pickle"),
        real_bugs=("pytorch/rl #3055", "pytorch/rl #3056", "pytorch/rl #3120"),
    ),
    Invariant(
        "transformed_once", seed=2, number=2,
        statement="a priority is transformed `(p + eps) ** alpha` exactly once per add, extend or update, "
        "whatever path wrote it; a new row's priority follows one declared rule",
        properties=(f"{PT}::test_writer_default_priority_is_transformed_once",
                    f"{PT}::test_updated_priority_is_transformed_once",
                    f"{PT}::test_priority_key_in_data_is_transformed_once"),
        mutants=("new_rows_get_priority_one", "priority_written_by_two_paths"),
        real_bugs=("pytorch/rl #2211", "ray-project/ray #11750", "pytorch/rl PR #2215", "pytorch/rl PR #2242"),
    ),
    Invariant(
        "pinned_as_asked", seed=3, number=9,
        statement="with `pin_memory=True` the returned sample is pinned after every transform, also a "
        "transform that builds a TensorDict with `device=None`, and so are the info keys; without an "
        "accelerator the request is a clear error at construction",
        properties=(f"{PM}::test_pin_step_is_last_and_sees_transformed_sample_and_info",
                    f"{PM}::test_returned_sample_is_pinned_on_cuda",
                    f"{PM}::test_pin_memory_without_accelerator_is_a_clear_error"),
        mutants=("pinned_sample_cloned_after_pinning",),
        real_bugs=("pytorch/rl #2404", "pytorch/rl #2206"),
    ),
    Invariant(
        "policy_in_place", seed=4,
        statement="a policy that cannot be deep-copied is used in place when no copy is needed, and "
        "otherwise fails with an error naming its class and the fix",
        properties=(f"{PP}::test_non_copyable_policy_is_used_in_place_when_no_copy_is_needed",
                    f"{PP}::test_non_copyable_policy_needing_a_copy_fails_with_a_clear_error",
                    f"{PP}::test_copyable_policy_is_copied_when_a_copy_is_asked_for"),
    ),
    Invariant(
        "tutorial_runs", seed=5,
        statement="the tutorial's trajectory example (docs/tutorial.md: episodes, steps, slice "
        "sampling) runs as written",
        properties=(f"{TS}::test_trajectory_example_runs_as_written",),
    ),
    Invariant(
        "live_slots", number=1,
        statement="every sampled index is a live slot; the weight returned belongs to the index returned",
        properties=(LIVE, MODEL),
        mutants=("float32_prefix_search_clamped_after_weight", "sample_range_from_cursor"),
        real_bugs=("pytorch/rl #2230 (PR #2239)", "ray-project/ray #7180", "pytorch/rl #1873"),
    ),
    Invariant(
        "weights", number=3,
        statement="importance weights are `(N P_i) ** -beta` over the declared normaliser, on the "
        "indices' device",
        properties=(LIVE, f"{SD}::test_weights_are_normalised_as_declared", MODEL),
        mutants=("batch_option_uses_memory_minimum", "weights_left_on_host"),
        real_bugs=("chainer/chainerrl PR #570", "pytorch/rl #2518"),
    ),
    Invariant(
        "stale_updates", number=4,
        statement="an update for a slot overwritten since it was sampled leaves the new occupant alone; "
        "never-written slots are not live; repeated slots in one update follow one rule",
        properties=(f"{SD}::test_stale_priority_updates_are_ignored",
                    f"{BI}::test_bad_input_is_refused_and_nothing_changes[index_never_written]",
                    f"{SS}::test_update_with_repeated_slots_samples_by_the_last_entry",
                    f"{CC}::test_concurrent_stale_updates_never_land_on_the_new_occupant", MODEL),
        mutants=("stale_priorities_applied_by_slot", "never_written_slot_taken_as_live",
                 "repeated_update_sums_every_entry"),
        real_bugs=("ray-project/ray #6534", "uber-research/ape-x #7", "pytorch/rl PR #4043",
                   "thu-ml/tianshou PR #94"),
    ),
    Invariant(
        "ring", number=5,
        statement="the ring keeps exactly the last `capacity` rows for any batch size (0, 1, capacity, "
        "over 2x capacity)",
        properties=(f"{RE}::test_ring_keeps_the_last_capacity_rows_for_any_batch_size",
                    f"{RE}::test_ring_eviction_matches_reference_and_closed_form"),
        mutants=("extend_over_twice_capacity_fails", "full_flag_set_before_the_write", "capacity_counted_in_batches"),
        real_bugs=("pytorch/rl PR #1295", "assume-framework/assume PR #855", "ray-project/ray #24393, #10958"),
    ),
    Invariant(
        "slices", number=6,
        statement="slices are contiguous, inside one episode, also across the ring's wrap and the write "
        "cursor; episodes are drawn as the closed form says",
        properties=(f"{TS}::test_slices_are_contiguous_and_inside_one_episode",
                    f"{TS}::test_slices_run_across_the_ring_wrap", f"{SD}::test_slice_sampling_matches_closed_form",
                    f"{SD}::test_short_episodes_are_sliced_only_without_strict_length"),
        mutants=("slice_start_drawn_over_whole_trajectory",),
        real_bugs=("pytorch/rl #2208", "pytorch/rl #1969", "instadeepai/flashbax PR #51"),
    ),
    Invariant(
        "checkpoint_identity", number=7,
        statement="save -> load is the identity on everything that decides future behaviour, also "
        "save -> save elsewhere -> load -> save -> load, and carrying on after a load",
        properties=(f"{CR}::test_save_load_round_trips_exactly",
                    f"{CH}::test_save_load_chain_and_carrying_on_match_no_checkpoint",
                    f"{CF}::test_checkpoint_that_does_not_fit_is_refused"),
        mutants=("sampler_metadata_not_json_encodable", "second_checkpoint_at_new_path_lost",
                 "full_flag_not_restored", "nested_field_missing_after_load", "refused_load_writes_into_held_rows"),
        real_bugs=("pytorch/rl #3055 (#3056)", "pytorch/rl PR #4388", "AI4Finance-Foundation/ElegantRL PR #299",
                   "thu-ml/tianshou #728", "DLR-RM/stable-baselines3 #1542"),
    ),
    Invariant(
        "new_buffer_is_empty", number=8,
        statement="a new buffer holds nothing it was not given",
        properties=(f"{RE}::test_new_buffer_holds_nothing_it_was_not_given",
                    "test_memmap_storage::test_reused_scratch_dir_starts_empty_and_keeps_the_users_files"),
        mutants=("scratch_dir_leaks_previous_run", "memmap_reads_previous_runs_rows"),
        real_bugs=("pytorch/rl #2437",),
    ),
    Invariant(
        "transitions", number=10,
        statement="n-step returns and next observations match an oracle: truncation is not termination, "
        "windows never cross an episode end or the write cursor",
        properties=(f"{TR}::test_sampled_transitions_match_the_oracle",
                    f"{TR}::test_truncated_step_bootstraps_from_its_own_final_obs",
                    f"{TR}::test_no_window_contains_another_episodes_or_a_newer_row",
                    f"{TR}::test_incomplete_windows_are_handled_as_declared",
                    f"{TR}::test_slice_ends_are_marked_and_episode_ends_keep_their_flags"),
        mutants=("sb3_934_timeout_bootstraps_from_next_episode", "sb3_1853_newest_row_next_is_an_old_row",
                 "sb3_1503_samples_the_unwritten_slot", "cleanrl_460_truncated_final_obs_lost",
                 "fasttd3_6_windows_cross_episodes_when_full", "fasttd3_6_window_crosses_the_write_cursor",
                 "fasttd3_7_done_mask_ignored", "fasttd3_7_gamma_not_gamma_n", "tianshou_135_nstep_wraps_before_full",
                 "tianshou_82_index_shifted_by_obs_next", "dopamine_213_truncated_trajectory_taken_as_valid",
                 "dopamine_228_extra_terminal_elements", "chainerrl_442_nstep_without_env_id",
                 "lerobot_918_reads_uninitialised_memory", "ray_18358_obs_shifted_by_nstep"),
        real_bugs=("DLR-RM/stable-baselines3 #1853, #934, #1503", "younggyoseo/FastTD3 #6",
                   "thu-ml/tianshou #135, #82", "google/dopamine #213, #228", "vwxyzjn/cleanrl #460",
                   "younggyoseo/FastTD3 PR #7", "chainer/chainerrl PR #442", "huggingface/lerobot PR #918",
                   "ray-project/ray PR #18358"),
    ),
    Invariant(
        "no_torn_rows", number=11,
        statement="concurrent writers and samplers never see a torn row, lose or duplicate a write",
        properties=(f"{CC}::test_concurrent_samples_never_see_a_torn_row",
                    f"{CC}::test_concurrent_writes_lose_and_duplicate_nothing",
                    f"{CC}::test_concurrent_sampling_matches_closed_form",
                    f"{CC}::test_checkpoint_taken_during_writes_is_a_consistent_snapshot"),
        real_bugs=("pytorch/rl #3463", "pytorch/rl #2185"),
    ),
    Invariant(
        "sample_cost", number=12,
        statement="the cost of a sample grows with the batch, not the capacity",
        real_bugs=("pytorch/rl #2669",),
        why_uncovered="a timing claim: measured as ratios in bench/, never asserted in a test",
    ),
    Invariant(
        "memory_ownership", number=13,
        statement="the buffer owns its memory and leaves the caller's alone: no call changes its "
        "arguments, and neither the caller's tensors nor a returned sample share memory with the storage",
        properties=(f"{OW}::test_buffer_keeps_no_reference_to_the_callers_tensors",
                    f"{OW}::test_calls_leave_their_arguments_unchanged",
                    f"{OW}::test_returned_samples_and_contents_share_no_memory_with_the_storage"),
        mutants=("update_sorts_the_callers_index", "add_writes_into_the_callers_row",
                 "sample_returns_its_output_buffer"),
        real_bugs=("thu-ml/tianshou #82", "cpprb #116", "Farama SuperSuit PR #116"),
    ),
    Invariant(
        "sampling_mass", number=14,
        statement="the sampling mass is the sum of the held priorities after any sequence of updates "
        "(one priority to 1e8 and back, thousands of small updates) and in any dtype",
        properties=(f"{SM}::test_sampling_mass_survives_long_update_sequences",),
        mutants=("float32_root_drifts",),
        real_bugs=("instadeepai/flashbax #52", "vwxyzjn/cleanrl #546"),
    ),
    Invariant(
        "checkpoint_touches_only_its_own", number=15,
        statement="a checkpoint touches only what it wrote: saving into a directory never deletes or "
        "rewrites the user's other files, nor a directory it did not create that its pointer names",
        properties=("test_checkpoint_user_files::test_saving_into_a_directory_with_the_users_files_leaves_them_"
                    "byte_identical",
                    "test_checkpoint_user_files::test_saving_never_deletes_the_directory_a_pointer_names"),
        real_bugs=("rbcheck issue 17 (dumps removed every ckpt-* entry)",),
    ),
    Invariant(
        "sampling_distribution",
        statement="every sampler draws as its closed form says: uniform over the held slots, "
        "proportional to the stored priorities, independently within a batch (or as declared), and "
        "the same uniforms give the reference's indices",
        properties=(f"{SD}::test_uniform_sampling_matches_closed_form",
                    f"{SD}::test_prioritized_sampling_matches_closed_form",
                    f"{SD}::test_draws_within_a_batch_are_independent",
                    f"{SD}::test_same_uniforms_give_same_indices_as_reference",
                    MODEL),
    ),
    Invariant(
        "bad_input_refused",
        statement="bad input is a clear error naming the argument and the allowed range, and leaves "
        "the buffer as it was",
        properties=(f"{BI}::test_parameters_outside_the_declared_range_are_refused",
                    f"{BI}::test_bad_input_is_refused_and_nothing_changes",
                    f"{BI}::test_bad_buffer_description_is_refused",
                    f"{BI}::test_priority_in_the_other_float_dtype_is_taken_or_refused_cleanly"),
    ),
    Invariant(
        "checkpoint_faults_refused",
        statement="a damaged, missing, misfit or half-written checkpoint, or one re-sealed with a state "
        "that contradicts itself, is refused with a clear error and changes nothing; an interrupted "
        "save leaves a loadable checkpoint",
        properties=(f"{CF}::test_damaged_checkpoint_is_refused_and_nothing_changes",
                    f"{CF}::test_missing_or_empty_directory_is_refused",
                    f"{CF}::test_checkpoint_that_does_not_fit_is_refused",
                    f"{CF}::test_interrupted_save_leaves_a_loadable_checkpoint",
                    f"{CF}::test_resealed_contradiction_is_refused_and_nothing_changes"),
    ),
    Invariant(
        "boundary_masses", number=16,
        statement="`sample()` never returns a zero-priority slot and reaches the last held slot; masses "
        "at 0, on a prefix boundary and just below the total map to the slot whose half-open interval "
        "holds them, whether the capacity is a power of two or not",
        properties=(f"{SM}::test_boundary_masses_map_to_the_right_slot",),
        mutants=("zero_priority_slot_sampled", "last_slot_excluded_from_total"),
        real_bugs=("JuliaReinforcementLearning RLTrajectories PR #56", "instadeepai/flashbax #52",
                   "hill-a/stable-baselines #941"),
    ),
    # issue 40: the samplers the field uses (reference/without_replacement_sampler.py,
    # consuming_sampler.py, iteration.py; harness/sampler_laws.py)
    Invariant(
        "epochs_without_replacement",
        statement="a sampler without replacement draws each slot held when its epoch started exactly once "
        "per epoch (the short tail dropped or returned as `drop_last` declares; slot order without "
        "`shuffle`, a uniform permutation with it; slots written mid-epoch wait), and a save and load "
        "mid-epoch resumes the same epoch",
        properties=("test_sampling_without_replacement::test_an_epoch_draws_every_held_slot_exactly_once",
                    "test_sampling_without_replacement::test_an_epoch_draws_each_slot_once_fixed_cases",
                    "test_sampling_without_replacement::test_an_epochs_tail_follows_drop_last",
                    "test_sampling_without_replacement::test_a_saved_epoch_resumes_after_load",
                    "test_sampling_without_replacement::test_shuffled_epochs_are_uniform_permutations"),
    ),
    Invariant(
        "consuming_sampler",
        statement="a consuming sampler never draws a row more than `max_sample_count` times, writes reuse "
        "the consumed slots first, and the counts survive a save and load",
        properties=("test_consuming::test_a_row_is_drawn_at_most_max_sample_count_times",
                    "test_consuming::test_writes_reuse_consumed_slots_first",
                    "test_consuming::test_consumption_survives_save_and_load"),
    ),
    Invariant(
        "iteration_and_prefetch",
        statement="iterating a buffer gives the batches repeated `sample()` gives (one epoch without "
        "replacement), and prefetching never changes a sample: the same stream, only held slots",
        properties=("test_iteration::test_iteration_gives_the_batches_of_repeated_sample",
                    "test_iteration::test_prefetch_gives_the_stream_without_prefetch"),
    ),
    Invariant("sample_all_whole_buffer", statement="`sample_all(k)`: every held row once, in slot order, "
              "never a slot not written, in `k` mini-batches of `len // k` rows, the tail dropped (skrl)",
              properties=("test_sample_all::test_sample_all_gives_every_held_row_once_in_slot_order",)),
    Invariant(
        "replacement_declared",
        statement="every sampler draws with or without replacement, within a batch and across batches, as "
        "its law says (the spec's, or the declared `Conventions.replacement`)",
        properties=("test_replacement::test_samplers_draw_with_or_without_replacement_as_declared",),
    ),
    Invariant("slice_samplers", statement="slices without replacement draw every valid start once per epoch; "
              "prioritized slices draw a start by its own step's `(p + eps) ** alpha`; no slice leaves its "
              "trajectory or crosses the write cursor", properties=tuple(f"test_slice_samplers::test_{t}" for t in (
                  "slice_epochs_draw_every_valid_start_once", "prioritized_slice_starts_follow_the_start_priorities"))),
    Invariant("staleness_weighting", statement="a staleness-aware sampler draws eligible rows with probability "
              "`1/(s+1)` normalised, independently, from the buffer's generator; none eligible: an error",
              properties=tuple(f"test_staleness::test_{t}" for t in ("staleness_draws_follow_the_declared_weighting",
                               "no_eligible_row_is_an_error", "staleness_draws_replay_from_the_seed"))),
    # issue 42: served replay, Reverb's table model (reference/served_table.py, selectors.py,
    # rate_limiter.py)
    Invariant(
        "served_selection",
        statement="a served table draws and drops items in its selectors' declared order (fifo, lifo, "
        "min_heap, max_heap; ties to the least recently inserted) and an item leaves on its "
        "`max_times_sampled`-th draw",
        properties=("test_served_selection::test_selectors_draw_in_declared_order",
                    "test_served_selection::test_an_item_leaves_after_max_times_sampled_draws"),
    ),
    Invariant(
        "rate_limiter",
        statement="a rate limiter admits inserts and samples only by Reverb's rule (no sample before "
        "`min_size_to_sample`, samples-per-insert inside its error buffer), from one thread or many; a "
        "refused call times out changing nothing, and a waiting call is admitted once room is made",
        properties=("test_rate_limiter::test_calls_are_admitted_by_the_rule",
                    "test_rate_limiter::test_threads_are_admitted_within_the_rule",
                    "test_rate_limiter::test_a_waiting_call_is_admitted_when_room_is_made"),
    ),
)

CATALOGUE += (  # issue 41: storages and writers of the field (reference/memmap_storage.py,
    # max_value_writer.py, writer.py's ImmutableWriter, buffer.set)
    Invariant(
        "disk_storage_is_memory",
        statement="a memory-mapped storage holds what the in-memory one holds, call for call, across the "
        "ring's wrap, edits and a close and reopen, and writes only in its declared directory",
        properties=("test_memmap_storage::test_memmap_storage_matches_the_memory_reference_call_for_call",),
    ),
    Invariant(
        "disk_faults_refused",
        statement="a storage file removed or truncated under the buffer, a directory without write "
        "permission or a full disk is a clear error naming the file or directory, and changes nothing",
        properties=("test_memmap_faults::test_a_file_removed_or_truncated_under_the_storage_is_a_clear_error",
                    "test_memmap_faults::test_a_directory_without_write_permission_is_a_clear_error",
                    "test_memmap_faults::test_a_full_disk_is_a_clear_error"),
    ),
    Invariant(
        "writers_keep_as_declared",
        statement="a max-value writer holds the top `capacity` rows of everything written by its value "
        "(ties to the earlier row; the rest dropped with slot -1); an immutable writer refuses every write "
        "and edit, and nothing changes",
        properties=("test_writers::test_max_value_writer_holds_the_top_k_of_everything_written",
                    "test_writers::test_immutable_writer_refuses_every_write_and_nothing_changes"),
    ),
    Invariant(
        "edits_in_place",
        statement="an in-place edit changes the edited rows and nothing else (length, cursor, write count, "
        "generations, priorities, other rows); an edit past the held length is refused and changes nothing",
        properties=("test_edits::test_an_edit_changes_the_edited_rows_and_nothing_else",
                    "test_edits::test_an_edit_past_the_held_length_is_refused_and_nothing_changes"),
    ),
    Invariant(
        "compressed_storage_exact",
        statement="a compressed storage gives back every row as written: every dtype (bool to bfloat16 and "
        "float64), the row shape (size-0 dimensions included) and the bits (-0.0, infinities, subnormals, "
        "full-range integers), call for call with the in-memory reference",
        properties=("test_compressed_storage::test_compressed_storage_round_trips_every_dtype_and_shape",),
    ),
    Invariant(
        "checkpoint_is_a_value",
        statement="a checkpoint round-trips every dtype exactly, writes to a buffer loaded from it leave its "
        "files byte-identical, and checkpoint, restore, checkpoint (over it), restore gives the current state",
        properties=("test_checkpointers::test_a_checkpoint_round_trips_every_dtype_and_stays_as_saved",),
    ),
)

CATALOGUE += (  # issue 42: hindsight relabelling and offline-to-online mixing (reference/her.py, mixing.py)
    Invariant(
        "hindsight_goals",
        statement="a relabelled goal is the goal reached after a held step of the row's own finished episode "
        "that the strategy allows (future: the row's step or later; final: the last; episode: any), never "
        "across the ring's wrap, an overwritten step or an unfinished episode (unless declared: harness/her_laws.py); "
        "its reward is recomputed with "
        "the declared reward function; the relabelled share follows the declared ratio; all of it after a "
        "save and a load",
        properties=("test_hindsight::test_relabelled_goals_come_from_the_strategys_steps_of_the_same_episode",
                    "test_hindsight::test_relabelled_share_follows_the_declared_ratio",
                    "test_hindsight::test_episode_bookkeeping_survives_save_and_load"),
        mutants=("her_episode_start_lost_on_load",),
        real_bugs=("DLR-RM/stable-baselines3 #1542",),
    ),
    Invariant(
        "offline_online_mixing",
        statement="each batch draws from the offline dataset and the online ring in the declared proportion, "
        "and the offline rows are never overwritten: every one is still drawn, uniformly and intact, after "
        "any number of online writes",
        properties=("test_mixing::test_batches_mix_the_sources_in_the_declared_proportion",
                    "test_mixing::test_offline_data_is_never_overwritten"),
    ),
)

BY_ID = {inv.id: inv for inv in CATALOGUE}


def base_id(property_id: str) -> str:
    """``file::test`` of ``file::test[param]``."""
    return property_id.split("[", 1)[0]


def seed_invariants() -> list[Invariant]:
    return sorted((inv for inv in CATALOGUE if inv.seed), key=lambda inv: inv.seed)


def seed_invariant_of(property_id: str) -> Invariant | None:
    """The seed invariant a property (``file::test``, any parametrization)
    checks, or None. A seed invariant covers every parametrization of its
    properties."""
    base = base_id(property_id)
    for inv in seed_invariants():
        if base in {base_id(p) for p in inv.properties}:
            return inv
    return seed_file_invariant(base.split("::", 1)[0])


def seed_file_invariant(stem: str) -> Invariant | None:
    """The seed invariant that owns a whole file of the suite (every
    catalogued property of ``stem`` checks it), or None. A property added to
    such a file is a test of that seed invariant before it is catalogued."""
    owners = {inv for inv in CATALOGUE for p in inv.properties if p.split("::", 1)[0] == stem}
    if len(owners) == 1:
        (inv,) = owners
        return inv if inv.seed else None
    return None


def seed_list_markdown(width: int = 76) -> str:
    """The README's numbered list of the seed invariants."""
    items = [textwrap.fill(f"{inv.seed}. {inv.statement};", width, subsequent_indent="   ")
             for inv in seed_invariants()]
    return "\n".join(items)[:-1] + "."


#: The generated blocks of the docs: (file, marker) -> the function that writes it.
GENERATED_MARK = "<!-- generated from rbcheck.harness.invariants: {} -->"


def replace_generated(text: str, name: str, content: str) -> str:
    """``text`` with the block between the two ``name`` markers replaced by
    ``content`` (the markers must be there)."""
    mark = GENERATED_MARK.format(name)
    head, sep, rest = text.partition(mark)
    _, sep2, tail = rest.partition(mark)
    if not (sep and sep2):
        raise ValueError(f"two markers {mark!r}, but found {text.count(mark)}")
    return f"{head}{mark}\n{content}\n{mark}{tail}"


def coverage_table_markdown() -> str:
    """``docs/coverage.md``'s table: every numbered invariant, its
    properties and its historic mutants (with the issues behind them)."""
    lines = ["| # | invariant | seed | properties | historic mutants | real bugs |", "|---|---|---|---|---|---|"]
    for inv in sorted((i for i in CATALOGUE if i.number), key=lambda i: i.number):
        props = ", ".join(f"`{p}`" for p in inv.properties) or f"**not covered**: {inv.why_uncovered}"
        mutants = ", ".join(f"`{m}`" for m in inv.mutants) or "none"
        lines.append(f"| {inv.number} | {inv.statement} | {inv.seed or ''} | {props} | {mutants} "
                     f"| {'; '.join(inv.real_bugs)} |")
    return "\n".join(lines)


GENERATED = {("README.md", "seed invariants"): seed_list_markdown,
             ("docs/coverage.md", "coverage table"): coverage_table_markdown}


def main(argv: list[str] | None = None) -> int:
    """``python -m rbcheck.harness.invariants [--check] [ROOT]``: rewrite the
    generated blocks of the README and docs/coverage.md from the catalogue
    (``--check``: exit 1, naming the file, when one is out of date)."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m rbcheck.harness.invariants", description=main.__doc__)
    parser.add_argument("--check", action="store_true")
    parser.add_argument("root", nargs="?", default=".")
    args = parser.parse_args(argv)
    stale = []
    for (name, block), make in GENERATED.items():
        path = Path(args.root) / name
        text = path.read_text(encoding="utf-8")
        new = replace_generated(text, block, make())
        if new != text:
            stale.append(name)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run python -m rbcheck.harness.invariants)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

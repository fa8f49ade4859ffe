"""One named bug hypothesis: what a failing kernel might do instead, as the reference can replay it.

A hypothesis is checked, never guessed: the reference is run again with its overrides, over the
inputs as the kernel would have read them and into the caches as it would have addressed them,
and it explains a failure only when the whole result (guard bands included) matches the kernel's
memory byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Machine-readable causes (the report's ``cause.id``). One id per bug class; the text of a
# hypothesis says the specifics (which view, which knob value).
CAUSES = {
    "index_stride_ignored": "the index tensor's stride is ignored (read as if contiguous)",
    "index_offset_ignored": "the index tensor's storage offset is ignored",
    "index_dtype_misread": "the index's entries are read with another width (int64 read as int32)",
    "slots_through_float": "slot numbers are carried through float32, exact only up to 2^24",
    "storage_offset_ignored": "a source's or a cache's storage offset is ignored (addressed from its storage's start)",
    "source_stride_ignored": "a source's row stride is ignored (rows read as if packed)",
    "cache_strides_swapped": "one cache (or output) is addressed with the other cache's (or the source's) strides",
    "dense_cache_assumed": "the caches are assumed dense (their strides are ignored)",
    "block_size_wrong_dim": "the block size is taken from the wrong dimension of the cache",
    "block_size_power_of_two": "the block size is rounded to a power of two (a shift and mask)",
    "block_size_hardcoded": "the block size is a constant (16), not the cache's",
    "scale_collapsed": "the per-head scale is collapsed to the first head's",
    "scale_swapped": "one tensor's fp8 scale is used for the other",
    "scale_misindexed": "the per-head scale is applied to the wrong elements (indexed another way)",
    "part_unscaled": "one part of the row is stored without the fp8 scale",
    "scale_missing": "the fp8 scale is not applied",
    "scale_inverted": "the fp8 scale multiplies where it should divide",
    "parts_swapped": "the two parts of the row are swapped",
    "part_misplaced": "a part of the row is written at the wrong offset",
    "rows_past_index": "rows past the index's length are written (a grid sized from the sources)",
    "slot_zero_skipped": "slot 0 is skipped though the contract reserves nothing",
    "zero_rows_skipped": "tokens whose rows are all zeros are taken for padding and not written",
    "only_minus_one_padding": "only -1 is treated as padding; other negatives are written",
    "padding_policy": "another padding policy than the declared one",
    "round_toward_zero": "fp8 codes are rounded toward zero",
    "ties_away": "fp8 ties are rounded away from zero",
    "ties_upward": "fp8 ties are rounded toward +inf (floor(x + 0.5): away from zero for positive values, toward zero for negative ones)",
    "subnormals_flushed": "fp8 subnormal results are flushed to zero",
    "subnormals_truncated": "fp8 subnormal results are rounded toward zero (normal ones to nearest)",
    "nan_bits_changed": "NaN inputs are not copied bit for bit (quieted or made a canonical NaN)",
    "copied_through_arithmetic": "a copy done with float arithmetic (0 + x): -0 becomes +0 and NaN bits change",
    "nan_mishandled": "NaN is written with another byte or sign",
    "negative_zero_mishandled": "-0 is written as +0",
    "wrong_fp8_format": "another fp8 format is written",
    "fp8_conversion": "another fp8 conversion (saturation, scale op, double rounding, preset)",
    "approximate_division": "the fp8 quotient comes from an approximate division",
    "sources_assumed_adjacent": "a source is read right after another in a fused row, not from its own pointer",
    "sources_swapped": "one source is written into another's cache",
    "index_assumed_consecutive": "the index is taken as a consecutive run because its ends are",
    "mapping_assumed_paged": "the SWA mapping read once per page (its first slot's entry plus the offset)",
    "mapping_dtype_misread": "the SWA mapping's words read as another integer type (loc's)",
    "results_permuted": "the right results returned in another order",
    "rows_misrouted": "rows the reference writes at one slot are written at another (an entry paired with the wrong slot or source row)",
    "rows_dropped": "the last rows are not written (a loop bound short of the index's length)",
    "token_count_limit": "more than 65535 tokens mishandled (the tokens put on a launch grid's y or z dimension, which holds 65535, or counted in 16 bits)",
    "inference_mode_unsupported": "the kernel fails only under torch.inference_mode() (a version counter read, or a check or memo keyed on it)",
    "compile_unsupported": "the kernel fails only when called through torch.compile",
    "mutation_undeclared": "the kernel's op does not declare the caches it writes, so torch.compile drops the write",
    "slots_narrowed": "slot numbers kept in 16 bits (a packed 32-bit key slot << 16 | position, an int16 or uint16 table)",
    "slot_table_collision": "distinct slots that collide in a duplicate-resolution table (slot modulo its size) are not written",
    "cache_layout_ignored": "the caches' strides or storage offsets are not honoured",
    "int32_offsets": "offsets past 2^31 elements wrap (computed in 32 bits)",
    "dcp_modulo": "DCP locs selected or divided with the other modulo",
    "torn_rows": "a duplicated slot holds a row torn from several sources",
    "validation_missing": "bad input not rejected before anything is written",
    "stale_state": "a later call reuses what an earlier call read (state kept between calls)",
    "earlier_call_state": "a call of one fp8 or block format, layout, row shape or source dtype is written as an earlier call of another was (a table, compiled variant or launch plan keyed without it)",
    "not_reproducible": "the case passes when run again: the result depends on earlier calls or on timing",
    "returned_layout": "the returned tensor has another dtype, shape or device than the contract's",
    "input_modified": "an input (a source, the index, a scale) was modified",
    "result_strides_ignored": "the returned tensor filled in its memory order, its own (permuted) strides ignored",
    "result_reused": "a returned tensor is overwritten by a later call (a static output buffer)",
    "nothing_written": "nothing was written",
    "empty_call_raised": "the kernel raised on a call with nothing to write (N = 0, or every entry padding)",
    "row_overrun": "rows written past their end (whole vectors, no tail handling)",
    "row_tail_dropped": "each row's last bytes past its last whole vector are not written (no tail loop)",
    "row_tail_written": "the row past its written part is overwritten",
    "stray_writes": "bytes outside the call's own entries are changed (a page cleared first, a tile's or vector's spill), while every entry is right",
    "scale_applied_unquantized": "an unquantized (auto) write scaled by the fp8 scale it must ignore",
    "byte_order_reversed": "words (16-, 32- or 64-bit) stored with their bytes in the other order",
    "ties_toward_zero": "fp8 ties rounded toward zero (round half down) instead of to even",
    "subnormals_mishandled": "fp8 subnormals encoded with a boundary or quantum one binade off (a hand-written conversion)",
    "accumulated_into_cache": "rows added to what the cache held (an accumulating scatter) instead of stored",
    "equal_values_skipped": "writes skipped where the cache already compared equal to the new value (as a float, -0 as +0, or over part of a row)",
    "shared_exponent_off_by_one": "the shared (block) exponent is off by one",
    "block_scaling_rule": "another block-scaling rule (the exponent's rounding, where the per-tensor scale applies)",
    "block_scale_wrong": "block scales from a wrong amax or exponent (each block's elements right under the scale written)",
    "block_nonfinite": "zero, NaN or inf blocks scaled or written another way",
    "block_scale_unrounded": "elements scaled by the block scale before its rounding to the stored format",
    "global_scale_misapplied": "the per-tensor scale is applied twice, not at all, inverted or rounded to the source's type",
    "nibbles_swapped": "the two 4-bit codes of each byte are swapped",
    "padding_into_slot_zero": "padding rows are quantized and written into slot 0",
    "scale_layout_wrong": "the scale cache is written in another layout than its own",
    "blocks_straddle_heads": "scaling blocks run across head boundaries",
    "partial_block_mishandled": "only the partial last block of each row is wrong (its codes or its scale): a loop over whole blocks only",
    "block_multiplier_range": "the elements of blocks whose scale lies past a power of two are wrong (the element multiplier over- or underflows its type)",
    "block_amax_read_ahead": "a row's partial last block is scaled by elements past the row's end (an unmasked load)",
    "element_rounding": "the 4-bit elements are rounded another way (ties away from zero, toward zero)",
    "source_narrowed": "the sources are converted through a narrower float type before use (range or precision lost)",
}


GRID_DIMENSION_MAX = 65535  # the most blocks a CUDA launch grid's y or z dimension holds

# The override of a hypothesis whose misread index can repeat a slot (decoys are drawn with
# replacement; slots rounded alike collide): any whole colliding row is then allowed, as for a
# kernel that declares duplicates="any".
ANY_DUPLICATES = {"duplicates": "any"}


@dataclass(frozen=True)
class Hypothesis:
    """``cause``: a key of :data:`CAUSES`; ``text``: the specific behaviour, in words.
    ``override``: keyword arguments for the spec's ``expected`` (reference knobs and spec
    overrides). ``views``: view name -> (shape, strides, offset[, region]) the kernel addressed
    instead of the real view's. ``inputs``: view name -> function of the numpy array the kernel should have
    read, returning the array it read instead."""

    cause: str
    text: str
    override: dict = field(default_factory=dict)
    views: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)  # name -> Callable[[np.ndarray], np.ndarray]

    def __post_init__(self):
        if self.cause not in CAUSES:
            raise ValueError(f"cause={self.cause!r} is not one of {', '.join(CAUSES)}")


def alternatives_text(values) -> str:
    """``[2, 4, 8]`` as "2, 4 or 8": the sizes a hypothesis's text names where each of them
    replays to the same memory."""
    return " or ".join(", ".join(map(str, values)).rsplit(", ", 1))


def by_role(views: dict, role: str) -> list:
    """The case's views (name -> ViewSpec) whose role is ``role`` ("index", "source", "cache", ...)."""
    return [v for v in views.values() if v.role == role]

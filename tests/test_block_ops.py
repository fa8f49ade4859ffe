"""The block-scaled ops in the engine: contract fields, gaps, the block_scaled case class, and a
plug-in judged under what it declares (oracle.contract, oracle.cases, oracle.ops.block_scaled)."""

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract, gaps
from oracle.kernels import torch_block
from oracle.ops import get_spec
from oracle.registry import Kernel, Registry
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, UNDECLARED, run_case


def contract(**fields) -> Contract:
    return Contract(op=fields.pop("op", "reshape_and_cache_block"), name="vendor.block", backend="vendor",
                    **fields)


def test_a_preset_applies_to_its_own_family_only():
    c = contract(block_formats=("nvfp4", "mxfp8_e4m3fn"), block_preset="te_mxfp8")
    assert c.block_knob_values("mxfp8_e4m3fn").nonfinite == "inf_saturates"
    assert c.block_knob_values("nvfp4").zero_guard == "stored"  # nvfp4_ref, untouched
    c = contract(block_formats=("nvfp4",), block_knobs=(("zero_guard", "unrounded"), ("exponent", "ceil")))
    assert c.block_knob_values("nvfp4").zero_guard == "unrounded"


@pytest.mark.parametrize("fields, message", [
    (dict(block_formats=("nvfp4",), block_preset="bogus"), "preset='bogus'"),
    (dict(block_formats=("mxfp4",)), "block_formats has ['mxfp4']"),
    (dict(block_formats=("nvfp4",), block_knobs=(("nibbles", "x"),)), "unknown block-scaling knob"),
    (dict(op="store_cache", block_formats=("nvfp4",)), "only quantize_block, reshape_and_cache_block"),
    (dict(scale_layouts=("tiled",)), "scale_layouts has ['tiled']"),
])
def test_a_bad_manifest_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        contract(**fields)


def test_an_undeclared_format_or_layout_is_a_gap_worth_probing():
    spec = get_spec("reshape_and_cache_block")
    c = contract(block_formats=("mxfp8_e4m3fn",), scale_layouts=("linear",), padding="negative")
    case = next(x for x in catalogue(spec.name, "quick", c) if x.id == "nvfp4-swizzled_scales")
    found = {g.key: g for g in gaps(c, spec.needs(case))}
    assert set(found) == {"block_format", "scale_layout"} and all(g.probe for g in found.values())
    assert "block format nvfp4 not declared" in found["block_format"].text


@pytest.mark.parametrize("op", ["quantize_block", "reshape_and_cache_block"])
def test_the_block_scaled_class_reaches_every_format_and_the_straddling_head(op):
    ids = [c.id for c in catalogue(op, "quick") if c.cls == "block_scaled"]
    for fmt in ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4"):
        special = "nvfp4-scale_calibrated-special" if fmt == "nvfp4" else f"{fmt}-special"
        assert {special, f"{fmt}-zero_blocks", f"{fmt}-nonfinite", f"{fmt}-4x40-special"} <= set(ids)
        if op == "reshape_and_cache_block":
            assert {f"{fmt}-HND", f"{fmt}-13x160-swizzled_scales", f"{fmt}-swizzled_scales-pad_negative"} <= set(ids)
    assert "nvfp4-scale_0.37-special" in ids and "nvfp4-scale_1.0-special" in ids


def test_a_plugin_is_judged_under_what_it_declares():
    """An NVFP4-only writer that declares linear scales: its NVFP4 cases pass, an MX case is
    probed (works, not declared), and the reserved-slot padding it never declared is n/s."""
    registry = Registry()

    def register():
        import oracle
        oracle.register(torch_block.reshape_and_cache_block, op="reshape_and_cache_block", name="vendor.nvfp4",
                        backend="vendor", validates=True, padding="negative", block_formats=("nvfp4",),
                        block_preset="nvfp4_vllm", scale_layouts=("linear",))

    registry.load_plugin("vendor", register)
    assert not registry.errors
    kernel = registry.kernels["vendor.nvfp4"]
    cases = {c.id: c for c in catalogue("reshape_and_cache_block", "quick", kernel.contract)}
    assert run_case(kernel, cases["nvfp4-scale_calibrated-special"]).status == PASS
    assert run_case(kernel, cases["mxfp8_e4m3fn-special"]).status == UNDECLARED
    assert run_case(kernel, cases["int32-pad_reserved0"]).status == NOT_SUPPORTED


def test_a_writer_whose_nan_blocks_differ_fails_and_says_why():
    """The torch writer declared under the TransformerEngine preset it does not follow: the
    non-finite MX case fails, and the cause names the non-finite block handling."""
    registry = Registry()

    def register():
        import oracle
        oracle.register(torch_block.quantize_block, op="quantize_block", name="vendor.te", backend="vendor",
                        validates=True, block_formats=("mxfp8_e4m3fn",),
                        block_knobs=(("nonfinite", "inf_saturates"),))

    registry.load_plugin("vendor", register)
    kernel = registry.kernels["vendor.te"]
    case = next(c for c in catalogue("quantize_block", "quick", kernel.contract) if c.id == "mxfp8_e4m3fn-nonfinite")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "block_nonfinite" and "nan_scale" in outcome.cause["text"]


def _negative_nan_with_its_sign(codes, scales, x, fmt, global_scale=None):
    """NVFP4 with the e2m1 encoder's sign ORed into a NaN's code: a negative NaN as 15 (-6)."""
    torch_block.quantize_block(codes, scales, x, fmt, global_scale)
    negative_nan = (x.isnan() & x.signbit()).reshape(x.shape[0], x.shape[1], -1, 2)
    low, high = negative_nan[..., 0], negative_nan[..., 1]
    codes.copy_(codes | (low.to(torch.uint8) * 0x08) | (high.to(torch.uint8) * 0x80))


def test_an_nvfp4_negative_nan_written_with_its_sign_is_named():
    contract = Contract(op="quantize_block", name="vendor.signed_nan", backend="test", validates=True,
                        block_formats=("nvfp4",))
    case = next(c for c in catalogue("quantize_block", "quick", contract) if c.id == "nvfp4-nonfinite")
    outcome = run_case(Kernel(contract, _negative_nan_with_its_sign, "test"), case)
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "block_nonfinite" and "'signed_max'" in outcome.cause["text"], outcome.message
    assert run_case(Kernel(contract, torch_block.quantize_block, "test"), case).status == PASS


def _padding_scales_into_slot_zero(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                                   slot_mapping, fmt, k_global_scale, v_global_scale):
    """A racing writer of sglang's bug, its race settled one way: every row written correctly,
    then slot 0's scale bytes overwritten by a padding row's (the codes' race went to the real row,
    the scales' to a padding row)."""
    import torch

    torch_block.reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                                        slot_mapping, fmt, k_global_scale, v_global_scale)
    pad = int(torch.nonzero(slot_mapping < 0)[0])
    zero = slot_mapping.clone()
    zero[:] = -1
    zero[pad] = 0  # the padding row alone, into slot 0, codes and scales ...
    codes = [c.clone() for c in (key_cache, value_cache)]
    torch_block.reshape_and_cache_block(key, value, *codes, key_scale_cache, value_scale_cache, zero, fmt,
                                        k_global_scale, v_global_scale)  # ... of which the scales stay


@pytest.mark.parametrize("case_id", ["mxfp8_e4m3fn-swizzled_scales-pad_negative", "int32-pad_negative"])
def test_padding_quantized_into_slot_zero_is_named_in_either_scale_layout(case_id):
    """Rows that collide in slot 0 may each win a different view (a race); the hypothesis allows any
    colliding row per view, in a swizzled scale cache too."""
    registry = Registry()

    def register():
        import oracle
        oracle.register(_padding_scales_into_slot_zero, op="reshape_and_cache_block", name="vendor.pad0",
                        backend="vendor", validates=True, padding="negative", layouts=("NHD", "HND"),
                        block_formats=("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4"), scale_layouts=("linear", "swizzled"))

    registry.load_plugin("vendor", register)
    kernel = registry.kernels["vendor.pad0"]
    case = next(c for c in catalogue("reshape_and_cache_block", "quick", kernel.contract) if c.id == case_id)
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL, outcome.message
    assert outcome.cause["id"] == "padding_into_slot_zero", (outcome.cause, outcome.message[:2000])


def test_swizzle_faults_against_hand_derived_offsets():
    """Each fault of the 128x4 tiled layout at 208 rows x 5 columns (two row tiles, two column
    tiles), from the formula written out entry by entry."""
    from oracle.reference import block_scaled as ref

    rows, cols = 208, 5
    for fault in (None,) + ref.SWIZZLE_FAULTS:
        got = ref.swizzled_offsets(rows, cols, fault)
        for r in range(rows):
            for c in range(cols):
                col_tiles = 1 if fault == "col_tiles_floor" else 2
                tile = c // 4 * 2 + r // 128 if fault == "tiles_column_major" else r // 128 * col_tiles + c // 4
                inside = (r % 128) * 4 if fault == "rows_not_interleaved" else (r % 32) * 16 + (r % 128) // 32 * 4
                assert got[r, c] == tile * 512 + inside + c % 4, (fault, r, c)
    assert ref.swizzled_offsets(rows, cols, "col_tiles_floor")[128, 0] == 512  # on top of (0, 4)
    with pytest.raises(ValueError, match="fault"):
        ref.swizzled_offsets(rows, cols, "transposed")


def _swizzle_fault_writer(fault):
    """The torch writer with its swizzled offsets table computed with ``fault``, one token after
    another (where the faulty table maps two tokens' scales to one byte, the later one's stays)."""
    import torch

    from oracle.reference import block_scaled as ref

    def offsets(rows, cols, device):
        return torch.from_numpy(ref.swizzled_offsets(rows, cols, fault)).to(device)

    def kernel(key, value, *rest):
        *caches, slot_mapping, fmt, k_gs, v_gs = rest
        real = torch_block._swizzled_offsets
        torch_block._swizzled_offsets = offsets
        try:
            for i in range(len(slot_mapping)):
                torch_block.reshape_and_cache_block(key[i:i + 1], value[i:i + 1], *caches, slot_mapping[i:i + 1],
                                                    fmt, k_gs, v_gs)
        finally:
            torch_block._swizzled_offsets = real
    return kernel


@pytest.mark.parametrize("fault, words", [("col_tiles_floor", "rounded down"),
                                          ("tiles_column_major", "column-major"),
                                          ("rows_not_interleaved", "not interleaved")])
def test_a_swizzle_fault_is_named(fault, words):
    """A writer whose swizzled layout is wrong in one way fails the wide-page swizzled cases, and
    every failure names that way."""
    from oracle.registry import Kernel

    fields = dict(op="reshape_and_cache_block", name="vendor.swizzle", backend="vendor", validates=True,
                  padding="negative", layouts=("NHD", "HND"), scale_layouts=("linear", "swizzled"),
                  block_formats=("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4"))
    kernel = Kernel(Contract(**fields), _swizzle_fault_writer(fault), "vendor")
    failed = [run_case(kernel, case) for case in catalogue("reshape_and_cache_block", "quick", kernel.contract)
              if case.p.get("scale_layout") == "swizzled"]
    failed = [o for o in failed if o.status == FAIL]
    assert failed
    for outcome in failed:
        assert outcome.cause and outcome.cause["id"] == "scale_layout_wrong", outcome.message[:1500]
        assert words in outcome.cause["text"] + " ".join(a["text"] for a in outcome.cause["also"]), outcome.cause


def _v_scales_with_k_strides(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, *rest):
    """V's scale cache addressed with K's scale-cache strides (one set of scale strides for both)."""
    if value_scale_cache.dim() == 4:
        value_scale_cache = value_scale_cache.as_strided(value_scale_cache.shape, key_scale_cache.stride(),
                                                         value_scale_cache.storage_offset())
    torch_block.reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, *rest)


def test_v_scales_addressed_with_k_strides_are_caught_and_named():
    from oracle.registry import Kernel

    fields = dict(op="reshape_and_cache_block", name="vendor.scale_strides", backend="vendor", validates=True,
                  padding="negative", layouts=("NHD", "HND"), block_formats=("mxfp8_e4m3fn", "nvfp4"))
    kernel = Kernel(Contract(**fields), _v_scales_with_k_strides, "vendor")
    unequal = [c for c in catalogue("reshape_and_cache_block", "quick", kernel.contract) if c.p.get("cache") == "unequal"]
    outcomes = [run_case(kernel, c) for c in unequal]
    failed = [o for o in outcomes if o.status == FAIL]
    assert unequal and failed
    assert all(o.cause and o.cause["id"] == "cache_strides_swapped" for o in failed), [o.message[-600:] for o in failed]


def _codes_last_scales_first(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                             fmt, k_global_scale, v_global_scale):
    """A writer that settles a duplicated slot two ways: its codes from the last colliding token,
    its scales from the first (each token's codes written in order, its scales in reverse)."""
    for order, keep_scales in ((range(len(slot_mapping)), False), (reversed(range(len(slot_mapping))), True)):
        for i in order:
            caches = [c.clone() for c in (key_cache, value_cache, key_scale_cache, value_scale_cache)]
            torch_block.reshape_and_cache_block(key[i:i + 1], value[i:i + 1], *caches, slot_mapping[i:i + 1], fmt,
                                                k_global_scale, v_global_scale)
            for kept, target in zip(caches[2:] if keep_scales else caches[:2],
                                    (key_scale_cache, value_scale_cache) if keep_scales else (key_cache, value_cache)):
                target.copy_(kept)


def test_a_duplicated_slot_with_codes_and_scales_from_different_rows_is_a_torn_row():
    from oracle.registry import Kernel

    fields = dict(op="reshape_and_cache_block", name="vendor.dups", backend="vendor", padding="negative",
                  duplicates="any", block_formats=("mxfp8_e4m3fn", "nvfp4"))
    kernel = Kernel(Contract(**fields), _codes_last_scales_first, "vendor")
    dups = [c for c in catalogue("reshape_and_cache_block", "quick", kernel.contract) if c.p.get("dups")]
    outcomes = [run_case(kernel, c) for c in dups]
    assert dups and all(o.status == FAIL for o in outcomes), [o.message[-400:] for o in outcomes]
    assert all("torn" in o.message or (o.cause and o.cause["id"] == "torn_rows") for o in outcomes)

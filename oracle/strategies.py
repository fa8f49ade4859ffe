"""Hypothesis strategies that draw cases inside a kernel's contract, for property tests.

The drawn case goes through the same pipeline as the catalogue's (oracle.runner.run_case), so a
property failure reports, dumps and replays like any other; hypothesis shrinks it first.
"""

from __future__ import annotations

from hypothesis import strategies as st

from .contract import Contract
from .ops import get_spec
from .ops.base import Case

MAX_ROWS = 300
LARGE_ROWS = (1024, 1500, 4096, 4099)  # past the size gates of real kernels' fast paths
LARGE_ONE_IN = 8  # how often a case draws one of LARGE_ROWS (in the spec's narrow large-N row)


@st.composite
def cases(draw, op: str, contract: Contract) -> Case:
    """A case of ``op`` that ``contract`` declares: its dtypes, index dtypes, layouts, padding,
    duplicates and fp8 formats only, with random sizes, shapes and strides; one case in
    LARGE_ONE_IN has a large N, and sources longer than the index where the contract allows; for a
    block-scaled writer, its formats, value sets, per-tensor scales and scale cache layouts."""
    spec = get_spec(op)
    large = draw(st.integers(0, LARGE_ONE_IN - 1)) == 0
    params = {"n": draw(st.sampled_from(LARGE_ROWS) if large else st.integers(0, MAX_ROWS))}
    dtypes = [d for d in spec.dtypes if d in contract.dtypes]
    if dtypes:
        params["dtype"] = draw(st.sampled_from(dtypes))
    if spec.index_dtypes:
        params["index"] = draw(st.sampled_from([d for d in spec.index_dtypes if d in contract.index_dtypes]))
        if contract.strided_index:
            params["index_layout"] = draw(st.sampled_from(["contig", "strided", "offset"]))
        if not spec.returns and contract.padding != "none":
            params["padding"] = draw(st.sampled_from([None, contract.padding]))
        if not spec.returns and contract.duplicates == "any":
            params["dups"] = draw(st.booleans()) or None
        if spec.dcp and contract.dcp_world > 1:  # negatives legal under the declared modulo
            params["dcp"] = draw(st.booleans()) or None
    params["shape"] = spec.large_n_shape if large and spec.large_n_shape else draw(spec.shape_strategy())
    sources = ["contig"] + ["fused", "gapped"][: 1 + (len(spec.sources) > 1)] * contract.strided_sources
    if spec.index_dtypes and not spec.returns and contract.source_rows == "index":
        sources.append("longer")
    if spec.sources and len(sources) > 1:
        params["src"] = draw(st.sampled_from(sources))
    if spec.aliasing and contract.aliased_caches:
        shared = ("padded", "unequal") if contract.shared_cache_strides else ()  # K's and V's strides differ
        params["cache"] = draw(st.sampled_from(("plain",) + tuple(a for a in spec.aliasing if a not in shared)))
    layouts = [l for l in spec.layouts if l in contract.layouts]
    if layouts:
        params["layout"] = draw(st.sampled_from(layouts))
    if spec.fp8 and contract.fp8_formats:
        fmt = draw(st.sampled_from((None,) + tuple(contract.fp8_formats)))
        if fmt is not None or not spec.dtypes:
            params["fp8"] = fmt or contract.fp8_formats[0]
            names = [name for name, meaning in contract.kv_cache_dtypes if meaning == params["fp8"]]
            if len(names) > 1:  # the first is every case's; any other is drawn now and then
                params["spelling"] = draw(st.sampled_from([None] + names[1:]))
            scales = [s for s in spec.fp8_scales if s != "head" or "head" in contract.scales]
            params["scale"] = draw(st.sampled_from(scales))
            params["values"] = draw(st.sampled_from(["random", "special"]))
    formats = [f for f in spec.block_formats if f in contract.block_formats]
    if formats:
        params["block"] = draw(st.sampled_from(formats))
        params["values"] = draw(st.sampled_from(["random", "special", "zero_blocks", "nonfinite"]))
        if params["block"] == "nvfp4":
            params["scale"] = draw(st.sampled_from(["calibrated", "1.0", "0.37"]))
        layouts = [l for l in ("linear", "swizzled") if l in contract.scale_layouts]
        if spec.layouts and len(layouts) > 1 and params.get("cache", "plain") == "plain":
            params["scale_layout"] = draw(st.sampled_from(layouts))
    case = Case.make(op, "property", **params)
    row_bytes = spec.row_bytes(case)
    if row_bytes % contract.row_bytes_multiple:
        params["shape"] = spec.default_shape
        case = Case.make(op, "property", **params)
    return case

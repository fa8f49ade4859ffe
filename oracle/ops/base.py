"""What every op spec provides, and the one-way pipeline that runs a case.

case -> inputs (an Arena of guarded views) -> kernel call -> reference -> comparison -> outcome.
A spec knows its op's calling convention: how to build valid inputs for a case, how to call the
reference with a contract's knobs, and what bad inputs look like. Nothing downstream reaches back.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from ..buffers import Arena, SHORT_NAMES
from ..contract import Contract
from ._bad_scales import BAD_SCALES, describe
from ._fp8cases import PER_HEAD_SCALES
from ._modes import MODE_IDS

PARAM_ORDER = ("dtype", "fp8", "spelling", "block", "index", "shape", "layout", "scale_layout", "src", "index_layout", "cache",
               "padding", "dups", "dcp", "scale", "values", "slots", "bad", "torch_mode", "repeat", "after", "large",
               "n")


@dataclass(frozen=True)
class Case:
    """One generated case: an op, its case class and its parameters. ``seed`` is derived from the
    id, so the same case always builds the same inputs on every machine."""

    op: str
    cls: str
    params: tuple = ()  # sorted (key, value) pairs

    @classmethod
    def make(cls, op: str, case_class: str, **params) -> "Case":
        return cls(op, case_class, tuple(sorted((k, v) for k, v in params.items() if v is not None)))

    @property
    def p(self) -> dict:
        return dict(self.params)

    @property
    def id(self) -> str:
        p = self.p
        parts = []
        for key in PARAM_ORDER:
            if key not in p:
                continue
            value = p[key]
            if key == "dtype":
                parts.append(SHORT_NAMES.get(value, value))
            elif key == "n":
                parts.append(f"N{value}")
            elif key == "shape":
                parts.append(shape_text(value))
            elif key in ("dups", "large", "dcp"):
                parts.append(key)
            elif key == "padding":
                parts.append("pad_" + str(value).replace(":", ""))
            elif key in ("src", "index_layout", "cache"):
                parts.append(f"{value}_{ {'src': 'src', 'index_layout': 'index', 'cache': 'cache'}[key]}")
            elif key == "spelling":
                parts.append(f"as_{value}")
            elif key == "scale_layout":
                parts.append(f"{value}_scales")
            elif key == "scale":
                parts.append(f"scale_{value}")
            elif key == "bad":
                parts.append(f"bad_{value}")
            elif key == "slots":
                parts.append(f"{value}_slots")
            elif key == "torch_mode":
                parts.append(MODE_IDS[value])
            elif key == "repeat":
                parts.append(f"repeat_{value}")
            elif key == "after":
                parts.append("after_" + str(value).replace("=", "_"))
            else:
                parts.append(str(value))
        return "-".join(parts)

    @property
    def seed(self) -> int:
        digest = hashlib.sha256(f"{self.op}/{self.cls}/{self.id}".encode()).digest()
        return int.from_bytes(digest[:4], "little")


@dataclass
class Prepared:
    """A case's inputs, ready to call: the arena, the kernel's arguments, and the reference's."""

    arena: Arena
    args: tuple  # positional arguments of the op's calling convention
    caches: tuple  # names of the views the kernel writes
    before: dict = field(default_factory=dict)  # region snapshots taken just before the call
    earlier: dict | None = None  # a "repeat" case: the snapshots taken before its first call

    def numpy(self, name: str) -> np.ndarray:
        """The numpy twin of a view as it was before the call."""
        return self.arena.numpy_view(self.before, name).copy()


def shape_text(shape: tuple) -> str:
    """A shape as case ids write it, ``1x64x97`` (and ``after="shape=1x64"``)."""
    return "x".join(map(str, shape))


def is_bad(case: Case) -> bool:
    """Whether the (judged) call of ``case`` has bad input: a ``bad`` case, or a ``repeat="bad"``
    case, whose second call gets an illegal slot."""
    return case.p.get("bad") is not None or case.p.get("repeat") == "bad"


class OpSpec:
    """Base class of the op specs in this package. Subclasses set the class attributes and
    implement ``build``, ``expected`` and ``bad_inputs``."""

    name: str = ""
    signature: str = ""
    dtypes: tuple = ()  # source/cache dtypes the catalogue exercises
    index_dtypes: tuple = ("int32", "int64")
    fp8: bool = False  # has a kv_cache_dtype / fp8 path
    default_shape: tuple = ()
    shapes: tuple = ()  # shape variants for the "sizes" case class
    sizes: tuple = (0, 1, 7, 133, 4096, 4099)  # 4099: past the size gates, and no multiple of any tile
    wide_cache_shape: tuple = ()  # (heads, head_size, block_size) of the "sizes" case over _build.WIDE_SLOTS slots
    large_n_shape: tuple = ()  # the row shape of the layout and padding cases at N = 4096 (a narrow one keeps them cheap)
    # a row shape with an empty part (an MLA rope of width 0): real writers switch to another kernel
    # there, which may follow the padding policy or not, so the "sizes" class runs it and the
    # "padding" class runs every policy in the first too (the others: in a wider row)
    empty_rope_shapes: tuple = ()
    # the narrowest row shape: the "past_float" case writes odd slots past 2**24 in a cache of
    # _build.FLOAT_SLOTS such rows (tens of MiB), where a slot carried through float32 rounds
    float_slots_shape: tuple = ()
    # a row shape of no multiple of 8 bytes: the prefill run again in it, so that rows sharing a
    # word of memory are written side by side (a read-modify-write of whole words loses bytes)
    odd_run_shape: tuple = ()
    # (shape, other shape) pairs that a plan keyed on part of the shape confuses (store_cache: V's
    # head size beside K's); the "repeat" class runs the first after a call in the second
    after_shapes: tuple = ()
    after_shape_params: dict = {}  # the rest of those cases' parameters (a scale layout that keeps a table)
    sources: tuple = ()  # sources that can be non-contiguous slices of one tensor
    source_layouts: tuple = ("fused",)  # the "strides" class's source layouts besides "gapped"
    index_2d_shape: tuple = ()  # a shape whose index is 2-D (the "strides" class lays it out too)
    dcp: bool = False  # has a DCP-sharded form (contract fields dcp_world, dcp_rank, dcp_modulo)
    aliasing: tuple = ("aliased", "offset")  # cache variants
    layouts: tuple = ()  # paged cache layouts
    returns: bool = False  # the op returns a tensor instead of writing a cache
    fp8_scales: tuple = ()  # scale variants of the "fp8" case class ("1.0", "0.0123", "head")
    # also writes unquantized ("auto") and takes its scales then too, which such a call must ignore
    fp8_optional: bool = False
    fp8_mixed_scales: bool = False  # two scales: the "fp8" class also gives them different kinds
    fp8_tail_shape: tuple = ()  # a shape whose rows are no multiple of 16 elements, for fp8 cases too
    block_formats: tuple = ()  # block-scaled formats of the "block_scaled" case class
    scale_arguments: tuple = ()  # the scale arguments, in signature order (where a bad scale value goes)
    large_case = None  # params (dict) of the "large" case (caches past 2**31 elements), or None
    paged = False  # caches [blocks, block_size, ...]: slot s is token s % block_size of block s // block_size

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        raise NotImplementedError

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        """Expected contents of each written view (ndarray or OneOfRows), by the reference under
        the contract's knobs; ``override`` replaces knobs to test alternative explanations."""
        raise NotImplementedError

    # views a slot writes together (a token's codes and their block scales): under duplicated
    # slots each group must hold one source position's row in all its views
    slot_groups: tuple = ()

    def alternatives(self, case: Case, contract: Contract) -> list:
        """The op's own bug hypotheses (:class:`oracle.diagnose.Hypothesis`): other behaviours a
        failing kernel might implement, as reference overrides and re-read inputs, so a failure can
        name its cause. The generic ones (strides, offsets, slot 0) come from oracle.diagnose."""
        return []

    def layout_alternatives(self, case: Case, contract: Contract, prepared: "Prepared") -> list:
        """The op's hypotheses that depend on the built case (its views' strides and offsets, or
        its values), after :meth:`alternatives`."""
        return []

    def observed_alternatives(self, case: Case, contract: Contract, prepared: "Prepared", after: dict) -> list:
        """The op's hypotheses built from what the kernel wrote (``after``: its memory), tried
        after every other: they assume more of the kernel's own result, so they name it only
        where nothing more specific does."""
        return []

    def difference_cause(self, case: Case, contract: Contract, prepared: "Prepared", after: dict,
                         expected: dict):
        """(cause, text) the op reads off the difference itself, where no hypothesis replays it
        (``expected``: the reference's memory); tried after every hypothesis and probe. None by
        default."""
        return None

    def shape_strategy(self):
        """Shapes for property tests (a hypothesis strategy); by default the catalogue's."""
        from hypothesis import strategies as st

        return st.sampled_from(tuple(dict.fromkeys((self.default_shape,) + tuple(self.shapes))))

    def row_bytes(self, case: Case) -> int:
        return 0

    def needs(self, case: Case) -> dict:
        """What a kernel must declare for this case to be inside its contract."""
        p = self.p_with_defaults(case)
        out = {"dtype": p.get("dtype"), "index_dtype": p.get("index") if self.index_dtypes else None,
               "fp8_format": p.get("fp8"), "kv_cache_dtype": p.get("spelling"), "scale": "head" if p.get("scale") in PER_HEAD_SCALES else
               ("tensor" if p.get("fp8") else None),
               "layout": p.get("layout"), "padding": p.get("padding"),
               "duplicates": bool(p.get("dups")), "strided_source": p.get("src") in ("fused", "gapped", "padded", "fused_unsqueezed", "interleaved"),
               "strided_heads": p.get("src") == "interleaved",
               "longer_source": p.get("src") == "longer", "dcp": bool(p.get("dcp")),
               "strided_index": p.get("index_layout") in ("strided", "offset"),
               "aliased_caches": p.get("cache") in ("aliased", "halves", "offset", "permuted", "unequal", "padded") or bool(p.get("large")),
               # K's and V's strides differ
               "cache_strides": p.get("cache") in ("padded", "unequal") and len(self.sources) > 1,
               "large_cache": bool(p.get("large")), "bad_input": is_bad(case),
               "torch_compile": p.get("torch_mode") == "compile",
               "row_bytes": self.row_bytes(case),
               # a spec with an empty-rope shape has shapes (first part, rope, ...)
               "empty_rope": bool(self.empty_rope_shapes) and p["shape"][1] == 0}
        return out

    def p_with_defaults(self, case: Case) -> dict:
        p = {"n": 133, "shape": self.default_shape, "index": "int64", "src": "contig",
             "index_layout": "contig", "cache": "plain", "values": "random"}
        if self.layouts:
            p["layout"] = self.layouts[0]
        if self.dtypes:
            p["dtype"] = self.dtypes[0]
        p.update(case.p)
        return p

    def bad_inputs(self) -> tuple:
        """Names of the bad-input variants ``build`` knows how to make."""
        return ()

    def bad_input_text(self, case: Case) -> str:
        """What the bad input of ``case`` is, for a verdict: its name, and for a bad scale value where
        it sits and which partial check lets it through (:mod:`._bad_scales`)."""
        bad = case.p.get("bad") or "out_of_range"
        if bad in BAD_SCALES and self.scale_arguments:
            return f"{bad}: {describe(bad, self.scale_arguments, case.p.get('scale') in PER_HEAD_SCALES)}"
        return bad

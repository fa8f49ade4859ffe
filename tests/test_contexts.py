"""Meta-tests: calls made inside ``torch.inference_mode()``, as every serving engine's forward makes them.

Inference tensors carry no version counter (``_version`` raises), and an in-place change of one moves
nothing a kernel could key a memo on. The ``contexts`` class builds each case's inputs and calls the
kernel under that mode (oracle.ops.base.call_context). A kernel that reads a version counter, or keeps
a check across calls keyed on one, must fail it, named ``inference_mode_unsupported`` (the torch
baselines pass it in the conformance suite); and a failure's bundle must replay in the same mode.
"""

import pytest
import torch

from oracle.bundle import replay, write_bundle
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.ops._build import LARGE_N
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case


def contexts_cases(op: str) -> list:
    return [c for c in catalogue(op, "quick") if c.cls == "contexts"]


@pytest.mark.parametrize("op", sorted(SPECS))
def test_every_op_is_called_under_inference_mode_also_past_the_size_gates(op):
    cases = contexts_cases(op)
    assert cases and all(c.p["torch_mode"] == "inference" for c in cases)
    assert {c.p.get("n") for c in cases} >= {None, LARGE_N}
    spec = SPECS[op]
    repeats = {c.p.get("repeat") for c in cases if c.p.get("n") == LARGE_N}
    if spec.index_dtypes and not spec.returns:
        assert "inplace" in repeats
        assert ("bad" in repeats) == ("out_of_range" in spec.bad_inputs())


def baseline(op: str) -> Kernel:
    return Kernel(Contract(op=op, name="ctx.baseline", backend="test", validates=True), getattr(tn, op), "test")


def test_the_kernel_is_called_with_inference_tensors_in_inference_mode():
    seen = []

    def spy(kv_buffer, loc, nope, rope):
        seen.append((torch.is_inference_mode_enabled(), loc.is_inference(), nope.is_inference()))
        tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)

    kernel = Kernel(Contract(op="set_mla_kv_buffer", name="ctx.spy", backend="test"), spy, "test")
    ordinary = next(c for c in catalogue("set_mla_kv_buffer", "quick") if c.cls == "sizes")
    assert run_case(kernel, contexts_cases("set_mla_kv_buffer")[0]).status == PASS
    assert run_case(kernel, ordinary).status == PASS
    assert seen == [(True, True, True), (False, False, False)]


def mla_reads_version(kv_buffer, loc, nope, rope):
    """Keys a memo on the index's version counter, as a check-reusing wrapper does."""
    if loc._version < 0:
        raise AssertionError("unreachable")
    tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)


_checked: dict = {}


def mla_keeps_check_under_inference(kv_buffer, loc, nope, rope):
    """Checks an index once and keeps the verdict per tensor and version, an inference tensor's
    version taken as 0 ("it has none, so it never changes"); then writes the legal rows."""
    key = (loc.data_ptr(), 0 if loc.is_inference() else loc._version)
    if _checked.get(id(loc)) != key:
        tn._check_index("loc", loc, kv_buffer.shape[0])
        _checked[id(loc)] = key
    keep = (loc >= 0) & (loc < kv_buffer.shape[0])
    rows = kv_buffer if kv_buffer.dim() == 2 else kv_buffer[:, 0]
    width = nope.shape[-1] + rope.shape[-1]
    rows[loc[keep].long(), :width] = torch.cat([nope.reshape(nope.shape[0], -1),
                                                rope.reshape(rope.shape[0], -1)], 1)[keep]


@pytest.mark.parametrize("fn, which", [
    (mla_reads_version, {"inference_mode", "repeat_inplace", "repeat_bad"}),
    (mla_keeps_check_under_inference, {"repeat_bad"}),
])
def test_a_kernel_that_keys_on_the_version_counter_is_caught_and_named(fn, which, tmp_path):
    _checked.clear()
    kernel = Kernel(Contract(op="set_mla_kv_buffer", name="ctx." + fn.__name__, backend="test", validates=True), fn, "test")
    failed = []
    for case in contexts_cases("set_mla_kv_buffer"):
        outcome = run_case(kernel, case)
        if outcome.status == FAIL:
            assert outcome.cause["id"] == "inference_mode_unsupported", f"{case.id}: {outcome.message}"
            failed.append((case, outcome))
    kinds = {("repeat_" + c.p["repeat"]) if "repeat" in c.p else "inference_mode" for c, _ in failed}
    assert kinds == which
    ordinary = next(c for c in catalogue("set_mla_kv_buffer", "quick") if c.cls == "repeat" and c.p["repeat"] == "bad")
    assert run_case(kernel, ordinary).status == PASS  # outside inference mode the version moves
    case, outcome = failed[0]
    if case.p.get("repeat") is None:  # its bundle replays the failure in the case's mode
        bundle = write_bundle(tmp_path, kernel, case, outcome)
        passed, text = replay(bundle, kernel)
        assert not passed and "version counter" in text, text
        assert replay(bundle, baseline("set_mla_kv_buffer"))[0]

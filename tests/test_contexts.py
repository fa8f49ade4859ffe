"""Meta-tests: calls made as serving engines make them (the ``contexts`` class).

Inside ``torch.inference_mode()``: inference tensors carry no version counter (``_version`` raises),
and an in-place change of one moves nothing a kernel could key a memo on. The class builds such a
case's inputs and calls the kernel under that mode (oracle.ops._modes.call_context). A kernel that
reads a version counter, or keeps a check across calls keyed on one, must fail it, named
``inference_mode_unsupported``; a failure's bundle must replay in the same mode.

Through ``torch.compile`` (oracle.ops._modes.as_called): an op registered with torch.library that
does not declare the caches it writes loses its write to functionalization, named
``mutation_undeclared``; the same op declaring them passes. (The torch baselines and our kernels
pass both modes in the conformance suite.)
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


def contexts_cases(op: str, mode: str = "inference") -> list:
    return [c for c in catalogue(op, "quick") if c.cls == "contexts" and c.p["torch_mode"] == mode]


@pytest.mark.parametrize("op", sorted(SPECS))
def test_every_op_is_called_under_inference_mode_and_compiled_also_past_the_size_gates(op):
    cases = contexts_cases(op)
    assert {c.p.get("n") for c in cases} >= {None, LARGE_N}
    spec = SPECS[op]
    repeats = {c.p.get("repeat") for c in cases if c.p.get("n") == LARGE_N}
    if spec.index_dtypes and not spec.returns:
        assert "inplace" in repeats
        assert ("bad" in repeats) == ("out_of_range" in spec.bad_inputs())
    compiled = contexts_cases(op, "compile")
    assert {c.p.get("n") for c in compiled} >= {None, LARGE_N}
    assert any(c.p.get("repeat") == "inplace" for c in compiled)


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


@torch.library.custom_op("kv_oracle_test::mla_write_undeclared", mutates_args=())
def mla_write_undeclared(kv_buffer: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor) -> None:
    """A writer registered as a pure op: it writes kv_buffer but declares nothing mutated."""
    tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)


@torch.library.custom_op("kv_oracle_test::mla_write_declared", mutates_args=("kv_buffer",))
def mla_write_declared(kv_buffer: torch.Tensor, loc: torch.Tensor, nope: torch.Tensor, rope: torch.Tensor) -> None:
    """The same writer, declaring the buffer it writes."""
    tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)


for _op in (mla_write_undeclared, mla_write_declared):
    _op.register_fake(lambda kv_buffer, loc, nope, rope: None)


def test_an_op_that_does_not_declare_its_write_loses_it_under_torch_compile_and_is_named():
    wrong = Kernel(Contract(op="set_mla_kv_buffer", name="ctx.undeclared", backend="test", validates=True), mla_write_undeclared, "test")
    right = Kernel(Contract(op="set_mla_kv_buffer", name="ctx.declared", backend="test", validates=True), mla_write_declared, "test")
    compiled = contexts_cases("set_mla_kv_buffer", "compile")
    for case in compiled:
        outcome = run_case(wrong, case)
        assert outcome.status == FAIL and outcome.cause["id"] == "mutation_undeclared", f"{case.id}: {outcome.message}"
        assert run_case(right, case).status == PASS, case.id
    for case in contexts_cases("set_mla_kv_buffer"):  # eagerly the undeclared op writes: only compiled calls fail
        if "repeat" not in case.p:
            assert run_case(wrong, case).status == PASS, case.id


def test_a_kernel_that_declares_no_torch_compile_is_not_run_compiled():
    calls = []

    def writer(kv_buffer, loc, nope, rope):
        calls.append(torch.compiler.is_compiling())
        tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)

    kernel = Kernel(Contract(op="set_mla_kv_buffer", name="ctx.eager_only", backend="test", torch_compile=False,
                             reasons=(("torch_compile", "eager only"),)), writer, "test")
    outcome = run_case(kernel, contexts_cases("set_mla_kv_buffer", "compile")[0])
    assert outcome.status == "not supported" and "torch_compile=False: eager only" in outcome.message
    assert calls == []
    traced = Kernel(Contract(op="set_mla_kv_buffer", name="ctx.traced", backend="test"), writer, "test")
    assert run_case(traced, contexts_cases("set_mla_kv_buffer", "compile")[0]).status == PASS
    assert calls and all(calls)  # dynamo traced the writer's frame


def test_a_writer_marked_eager_under_compile_runs_eagerly_inside_a_compiled_function():
    """oracle.kernels._compile.eager_under_compile, as our Triton writers use it: dynamo breaks the
    graph at the writer, which then runs as it runs eagerly (not traced), and writes its rows."""
    from oracle.kernels._compile import eager_under_compile

    seen = []

    def writer(cache, loc, src):
        seen.append(torch.compiler.is_compiling())
        cache.index_put_((loc,), src)

    for fn, traced in ((writer, True), (eager_under_compile(writer), False)):
        torch._dynamo.reset()
        seen.clear()
        cache, loc, src = torch.full((8, 4), -3.0), torch.tensor([1, 6]), torch.arange(8.0).reshape(2, 4)
        step = torch.compile(lambda c, l, s: fn(c, l, s * 2), backend="aot_eager")
        step(cache, loc, src)
        want = torch.full((8, 4), -3.0)
        want[loc] = src * 2
        assert torch.equal(cache, want) and seen == [traced]
        fn(cache, loc, src)  # called eagerly, it runs as it is
        assert seen[-1] is False

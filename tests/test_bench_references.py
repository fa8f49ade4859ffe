"""The bench's references: plain index_put_ writes the same bytes as the torch baseline, peers'
files are loaded by path and adapted to our calling convention, and the timing options parse."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from oracle.bench.cli import configure
from oracle.bench.references import index_put, load_peers
from oracle.bench.workloads import make_workload
from oracle.kernels import torch_native


@pytest.mark.parametrize("op, variant", [("store_cache", "bf16"), ("set_mla_kv_buffer", "bf16"),
                                         ("reshape_and_cache_flash", "auto"), ("reshape_and_cache_flash", "e4m3fn"),
                                         ("concat_and_cache_mla", "auto"), ("concat_and_cache_mla", "e4m3fn")])
def test_index_put_reference_writes_what_the_baseline_writes(op, variant):
    work = make_workload(op, variant, 37, seed=3)
    mine = tuple(a.clone() if isinstance(a, torch.Tensor) and i in work.caches else a for i, a in enumerate(work.args))
    ref = tuple(a.clone() if isinstance(a, torch.Tensor) and i in work.caches else a for i, a in enumerate(work.args))
    for i in work.caches:  # poison: the rows not written must stay as they were
        mine[i].view(torch.uint8).fill_(0x5A)
        ref[i].view(torch.uint8).fill_(0x5A)
    index_put(op)(*mine)
    getattr(torch_native, op)(*ref)
    for i in work.caches:
        assert torch.equal(mine[i].view(torch.uint8), ref[i].view(torch.uint8))
    assert index_put("quantize_fp8") is None


def test_a_peer_file_is_loaded_by_path_and_adapted(tmp_path):
    peer = tmp_path / "cache_ops.py"
    peer.write_text(textwrap.dedent("""
        calls = []
        def launch_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                           swa_slot_mapping=None, k_scale=None, v_scale=None):
            calls.append((key_cache.dtype, swa_slot_mapping, k_scale is not None))
    """))
    [(name, op, fn)] = load_peers(str(peer))
    assert (name, op) == ("sglang.cache_ops", "reshape_and_cache_flash")
    cache = torch.zeros(2, 16, 1, 8, dtype=torch.uint8)
    key = torch.zeros(3, 1, 8)
    slots = torch.arange(3)
    fn(key, key, cache, cache, slots, "e4m3fn", torch.ones(1), torch.ones(1))
    fn(key, key, cache.view(torch.bfloat16)[..., :4], cache.view(torch.bfloat16)[..., :4], slots, "auto", None, None)
    module = sys.modules["oracle_peer_cache_ops"]
    # fp8 caches are handed over as float8_e4m3fn views with the scales; "auto" without scales
    assert module.calls == [(torch.float8_e4m3fn, None, True), (torch.bfloat16, None, False)]


def test_a_file_without_a_known_writer_or_no_file_is_an_error(tmp_path):
    empty = tmp_path / "other.py"
    empty.write_text("x = 1\n")
    with pytest.raises(ValueError, match="defines neither launch_reshape_and_cache_flash"):
        load_peers(str(empty))
    with pytest.raises(ValueError, match="is not a file"):
        load_peers(str(tmp_path / "missing.py"))


def test_bench_options_and_a_missing_peer_file():
    parser = configure(__import__("argparse").ArgumentParser())
    args = parser.parse_args([])
    assert (args.mode, args.l2, args.peer_file) == ("both", "cold", [])
    args = parser.parse_args(["--mode", "eager", "--l2", "both", "--peer-file", "a.py", "--peer-file", "b.py"])
    assert (args.mode, args.l2, args.peer_file) == ("eager", "both", ["a.py", "b.py"])
    proc = subprocess.run([sys.executable, "-m", "oracle.bench", "--op", "store_cache", "--sizes", "4",
                           "--repeats", "1", "--peer-file", "/nonexistent/peer.py"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "--peer-file '/nonexistent/peer.py' is not a file" in proc.stderr


def test_a_reusing_writer_is_also_timed_with_its_index_checked_each_call():
    """oracle bench adds, for each CUDA writer that reuses its index's check, a row of the same
    writer called with reuse off (and only for such writers); reuse is back on after each call."""
    from types import SimpleNamespace

    from oracle.bench.runner import FRESH, fresh_index_rows
    from oracle.kernels import check_reuse

    seen = []

    @check_reuse.reusing("store_cache", padding="none")
    def writer(*args, validate=True):
        seen.append(check_reuse.ENABLED)

    contract = SimpleNamespace(device="cuda", backend="cuda")
    kernels = [SimpleNamespace(name="x.store_cache", fn=writer, contract=contract, unavailable=lambda: None),
               SimpleNamespace(name="x.store_cache.unchecked", fn=lambda *a: None, contract=contract,
                               unavailable=lambda: None),
               SimpleNamespace(name="cpu.store_cache", fn=writer, unavailable=lambda: None,
                               contract=SimpleNamespace(device="cpu", backend="cpu"))]
    rows = fresh_index_rows(kernels)
    assert [r.name for r in rows] == ["x.store_cache" + FRESH] and rows[0].contract is contract
    rows[0].fn(1, 2, 3, 4, 5)
    assert seen == [False] and check_reuse.ENABLED

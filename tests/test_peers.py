"""Peers' writers registered from their own files (oracle.peers): both writers of a file found,
vLLM's registered itself with its kv_cache_dtype names, sglang's through a wrapper that only
reorders its arguments, and a file without a known writer an error naming it."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from oracle.registry import Registry

PEER = """
calls = []
def launch_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping,
                                   swa_slot_mapping=None, k_scale=None, v_scale=None):
    calls.append(("sglang", key_cache.dtype, swa_slot_mapping, k_scale is not None))
def triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                   k_scale, v_scale):
    calls.append(("vllm", kv_cache_dtype))
"""


def discover(monkeypatch, *paths) -> Registry:
    monkeypatch.setenv("ORACLE_PEER_FILES", ":".join(map(str, paths)))
    monkeypatch.setenv("ORACLE_PLUGINS", "oracle.peers:register")
    registry = Registry()
    registry.discover()
    return registry


def test_both_writers_of_a_file_are_registered_with_the_contract_their_code_implies(tmp_path, monkeypatch):
    peer = tmp_path / "peer_ops.py"
    peer.write_text(textwrap.dedent(PEER))
    registry = discover(monkeypatch, peer)
    assert not registry.errors
    sglang, vllm = registry.kernels["sglang.peer_ops"], registry.kernels["vllm.peer_ops"]
    module = sys.modules["oracle_peer_peer_ops"]
    assert vllm.fn is module.triton_reshape_and_cache_flash  # unmodified
    assert vllm.contract.kv_cache_dtype("e4m3fn") == "fp8" and vllm.contract.fp8_formats == ("e4m3fn",)
    assert (sglang.contract.fp8_cache, sglang.contract.source_rows, vllm.contract.source_rows) == ("float8", "equal", "index")
    for k in (sglang, vllm):
        assert k.contract.shared_cache_strides and not k.contract.strided_index and k.contract.layouts == ("NHD",)
        assert k.contract.device == "cuda"
        if not torch.cuda.is_available():
            assert "no CUDA device" in k.unavailable()
    cache = torch.zeros(2, 16, 1, 8, dtype=torch.uint8).view(torch.float8_e4m3fn)
    key, slots, scale = torch.zeros(3, 1, 8), torch.arange(3), torch.ones(1)
    sglang.fn(key, key, cache, cache, slots, "e4m3fn", scale, scale)
    sglang.fn(key, key, cache, cache, slots, "auto", scale, scale)
    assert module.calls == [("sglang", torch.float8_e4m3fn, None, True), ("sglang", torch.float8_e4m3fn, None, False)]


def test_a_file_without_a_known_writer_is_a_plugin_error_naming_it(tmp_path, monkeypatch):
    other = tmp_path / "other.py"
    other.write_text("x = 1\n")
    registry = discover(monkeypatch, other)
    assert len(registry.errors) == 1 and "defines neither launch_reshape_and_cache_flash" in registry.errors[0].error
    registry = discover(monkeypatch, tmp_path / "missing.py")
    assert "ORACLE_PEER_FILES" in registry.errors[0].error and "is not a file" in registry.errors[0].error

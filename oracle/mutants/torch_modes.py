"""Mutants that are right when called plainly and wrong in the torch modes a serving engine calls
them in (the ``contexts`` class, oracle.ops._modes): inside ``torch.inference_mode()`` and
through ``torch.compile``. Built like :data:`oracle.mutants.kernels.MUTANTS`, each under exactly
its base's contract.
"""

from __future__ import annotations

import torch

from ..kernels import torch_native as tn
from ..kernels._compile import eager_under_compile
from .kernels import Mutant
from .stateful import _memo

_CHECKED: dict = {}


@eager_under_compile  # a Python wrapper run as it is inside torch.compile too, as our Triton writers are
def store_cache_keys_check_on_version(k, v, k_cache, v_cache, loc):
    """loc checked once per tensor and version counter (a check reused while torch sees loc
    unchanged), which an inference tensor does not have: ``loc._version`` raises there."""
    version = loc._version
    kept = _memo(_CHECKED, loc, lambda: [None])
    if kept[0] != version:
        tn.store_cache(k, v, k_cache, v_cache, loc)  # checked, then written
        kept[0] = version
        return
    k_cache.index_put_((loc.long(),), k[: loc.shape[0]])
    v_cache.index_put_((loc.long(),), v[: loc.shape[0]])


@torch.library.custom_op("kv_oracle_mutant::set_mla_kv_buffer_undeclared", mutates_args=())
def set_mla_undeclared_mutation(kv_buffer: torch.Tensor, loc: torch.Tensor, cache_k_nope: torch.Tensor,
                                cache_k_rope: torch.Tensor) -> None:
    """The torch writer registered as a torch.library op that declares nothing it mutates."""
    tn.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)


set_mla_undeclared_mutation.register_fake(lambda kv_buffer, loc, cache_k_nope, cache_k_rope: None)


T = "torch."
MODE_MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, catches, fn, cause)
                     for name, op, base, bug, catches, fn, cause in [
    ("store_cache.keys_check_on_version", "store_cache", T + "store_cache",
     "reuses loc's check while loc._version is unchanged, which raises for an inference tensor",
     ("contexts",), store_cache_keys_check_on_version, "inference_mode_unsupported"),
    ("set_mla_kv_buffer.undeclared_mutation", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "a torch.library op with mutates_args=() that writes kv_buffer: torch.compile drops the call",
     ("contexts",), set_mla_undeclared_mutation, "mutation_undeclared"),
])

__all__ = ["MODE_MUTANTS"]

"""Mutants of the conventions real kernels get wrong where they meet inputs of real serving:
slot 0 as a real slot, every kind of negative padding, a fast path taken only at large N, sources
longer than the index (vLLM's CUDA-graph padding), DCP-sharded MLA writes. Built like
:data:`oracle.mutants.kernels.MUTANTS`, each under exactly its base's contract.
"""

from __future__ import annotations

import torch

from ..kernels import torch_native as tn
from ..kernels._checks import mla_sources
from . import _raw
from .bases import check_store
from .kernels import Mutant, read_packed, paged_write


# --- store_cache (base torch.store_cache, or a bases.py variant) ------------------------------

def store_cache_skips_slot_zero(k, v, k_cache, v_cache, loc):
    keep = check_store(k, v, k_cache, v_cache, loc) & (loc != 0)  # slot 0 taken for padding
    index = loc[keep].long()
    k_cache.index_put_((index,), k[keep])
    v_cache.index_put_((index,), v[keep])


def store_cache_only_minus_one_is_padding(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc, padding="negative")  # base: skips every slot < 0
    keep = loc != -1  # `if (slot == -1) return;`: -2 and below become ptr + slot * stride
    for src, cache in ((k, k_cache), (v, v_cache)):
        _raw.write_rows_at(cache, cache.storage_offset() + loc[keep].long() * cache.stride(0), src[keep])


LARGE_N_PATH = 1024  # rows from which the mutant below takes its "vectorised" path


def store_cache_large_n_ignores_source_stride(k, v, k_cache, v_cache, loc):
    if loc.shape[0] >= LARGE_N_PATH:  # the fast path assumes packed rows; the small-N path is right
        k, v = read_packed(k), read_packed(v)
    tn.store_cache(k, v, k_cache, v_cache, loc)


# --- set_mla_kv_buffer (base torch.set_mla_kv_buffer.dcp2) -------------------------------------

DCP_WORLD, DCP_RANK = 2, 1  # the contract of torch.set_mla_kv_buffer.dcp2, the base below


def set_mla_dcp_floor_modulo(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """Keeps ``loc % W == rank`` and writes row ``loc // W`` with floor ``%`` and ``//`` (torch's)
    where the contract truncates (Triton's), and no sign check: at rank W - 1, -1 is kept as row
    -1 and written at ``ptr - stride``, in the guard band before the buffer."""
    dcp = dict(dcp_world=DCP_WORLD, dcp_rank=DCP_RANK)
    tn.set_mla_kv_buffer_dcp(kv_buffer, loc[:0], cache_k_nope[:0], cache_k_rope[:0], **dcp)  # shapes
    tn._dcp_rows(loc, kv_buffer.shape[0], DCP_WORLD, DCP_RANK, "truncate")  # the base's loc checks
    cache_k_nope, cache_k_rope = mla_sources(cache_k_nope, cache_k_rope, loc.shape[0])
    locs = loc.long()
    keep = torch.remainder(locs, DCP_WORLD) == DCP_RANK
    rows = torch.div(locs[keep], DCP_WORLD, rounding_mode="floor")
    data = torch.cat([cache_k_nope, cache_k_rope], dim=1)[keep]
    region = kv_buffer[:, : data.shape[1]]
    starts = region.storage_offset() + rows * region.stride(0)
    # A row past the allocation (a large negative loc) would fault in C; a mutant cannot do that
    # safely, so it leaves those out: the row before the buffer is the bug the suite must find.
    room = _raw.storage_elements(region).numel() - data.shape[1]
    inside = (starts >= 0) & (starts <= room)
    _raw.write_rows_at(region, starts[inside], data[inside])


# --- reshape_and_cache_flash (base torch.reshape_and_cache_flash) ------------------------------

def paged_grid_from_source_rows(key, value, key_cache, value_cache, slot_mapping, *rest):
    """One program per source row: slot_mapping is read past its end, up to key.shape[0]."""
    rows = key.shape[0]
    storage = _raw.storage_elements(slot_mapping)
    last = slot_mapping.storage_offset() + (rows - 1) * slot_mapping.stride(0)
    if rows and last >= storage.numel():
        raise IndexError(f"slot_mapping read at element {last}, past its storage (a segfault, in C)")
    widened = storage.as_strided((rows,), slot_mapping.stride(), slot_mapping.storage_offset())
    paged_write(key, value, key_cache, value_cache, slot_mapping, *rest, write=False)  # the checks
    paged_write(key, value, key_cache, value_cache, widened.clone(), *rest)


T = "torch."
CONVENTION_MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, catches, fn, cause)
                           for name, op, base, bug, catches, fn, cause in [
    ("store_cache.skips_slot_zero", "store_cache", T + "store_cache",
     "skips slot 0 as if it were the padding slot, though the contract reserves nothing",
     ("dtypes", "sizes"), store_cache_skips_slot_zero, "slot_zero_skipped"),
    ("store_cache.only_minus_one_is_padding", "store_cache", "mutant-base.store_cache.pad_negative",
     "skips only slot == -1; other negative slots are written at ptr + slot * stride",
     ("padding",), store_cache_only_minus_one_is_padding, "only_minus_one_padding"),
    ("store_cache.large_n_ignores_source_stride", "store_cache", T + "store_cache",
     f"ignores the source row stride on its fast path (N >= {LARGE_N_PATH}) only",
     ("strides",), store_cache_large_n_ignores_source_stride, "source_stride_ignored"),
    ("reshape_and_cache_flash.grid_from_source_rows", "reshape_and_cache_flash",
     T + "reshape_and_cache_flash",
     "sizes its grid from key's rows, reading slot_mapping past its end when key is longer",
     ("sizes",), paged_grid_from_source_rows, "rows_past_index"),
    ("set_mla_kv_buffer.dcp_floor_modulo", "set_mla_kv_buffer", T + "set_mla_kv_buffer.dcp2",
     "uses floor modulo where the contract truncates: -1 is selected by rank W-1 and written one "
     "row before the buffer",
     ("dcp",), set_mla_dcp_floor_modulo, "dcp_modulo"),
])

__all__ = ["CONVENTION_MUTANTS"]

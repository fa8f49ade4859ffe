"""The full->SWA translation a pool runs on a cache miss, which is also the registered kernel.

:func:`translate_full_to_swa` is ``mapping[loc]`` done strictly: ``-1`` (the padding sentinel)
translates to ``-1`` by an explicit mask, never by reading ``mapping[-1]``, and any other negative
slot or any slot past the table raises before anything is computed. :func:`default_translate_fn`
picks what a pool on a given device runs on a miss: the Triton kernel for CUDA tensors where
Triton can run, else :func:`translate_full_to_swa`.
"""

from __future__ import annotations

from typing import Callable

import torch

from .._checks import check_translate

SENTINEL = -1


def _position(shape: tuple, flat_index: int) -> str:
    """``'loc[3]'`` or ``'loc[1, 2]'`` for the C-order flat index into a tensor of that shape."""
    if len(shape) == 0:
        return "loc[()]"
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return f"loc[{', '.join(str(i) for i in reversed(idx))}]"


def translate_full_to_swa(mapping: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """``mapping[loc]`` as a new tensor of ``mapping``'s dtype and ``loc``'s shape, strictly.

    * ``mapping``: a non-empty 1-D int32/int64 tensor whose last entry is the -1 sentinel (any
      stride or storage offset); entries ``[0, len - 1)`` are the table proper.
    * ``loc``: int32/int64, any shape, strides and storage offset, on ``mapping``'s device.
    * ``-1`` translates to ``-1``, handled explicitly (it is masked, not read through
      ``mapping[-1]``); any other negative value, and any value ``>= len - 1`` (the sentinel's
      own index included), raises ``ValueError`` naming the first offending position in C order,
      before anything is computed. Wrong types or dtypes raise ``TypeError``.

    Checking ``loc`` reads it on the host (one device synchronisation on CUDA). Neither input is
    modified and the result never shares memory with them.
    """
    check_translate(mapping, loc)
    if loc.device != mapping.device:
        raise ValueError(f"loc is on {loc.device} but mapping is on {mapping.device}")
    table = mapping.numel() - 1  # mapping[table] is the sentinel
    if int(mapping[table]) != SENTINEL:
        raise ValueError(f"mapping[-1] = {int(mapping[table])} (mapping[{table}]): the last entry "
                         "must be the -1 sentinel")
    bad = (((loc < 0) & (loc != SENTINEL)) | (loc >= table)).reshape(-1)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        value = int(loc.reshape(-1)[i])
        where = f"{_position(tuple(loc.shape), i)} = {value}"
        if value < 0:
            raise ValueError(f"{where}: only -1 (the padding sentinel) may be negative; plain "
                             f"indexing would wrap it to mapping[{value}]")
        raise ValueError(f"{where}: past the table (entries 0..{table - 1}); mapping[{table}] is "
                         "the sentinel, reached only through -1")
    padding = loc == SENTINEL
    out = mapping[loc.long().clamp_min(0)]  # a fresh tensor; -1 reads mapping[0], then masked
    return out.masked_fill_(padding, SENTINEL)


def default_translate_fn(device) -> Callable:
    """The translation a pool on ``device`` uses on a cache miss: the Triton kernel
    (``oracle.kernels.triton.ops.translate_full_to_swa``, -1 handled in the kernel, nothing read
    outside the table) for CUDA tensors where Triton can run, else :func:`translate_full_to_swa`.
    The Triton package is imported here, lazily, and only for CUDA pools."""
    if torch.device(device).type == "cuda":
        try:
            from ..triton import backend_info, ops
        except ImportError:
            return translate_full_to_swa
        info = backend_info()
        if info["reason"] is None and not info["interpret"]:
            return ops.translate_full_to_swa
    return translate_full_to_swa

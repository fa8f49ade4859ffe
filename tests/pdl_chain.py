"""A GPU check for kernels launched with programmatic dependent launch (PDL): two writes in a row
where the second reads what the first wrote must see it, eagerly and replayed from a CUDA graph.

A PDL launch may be scheduled while the kernel before it still runs; only its griddepcontrol.wait
keeps it from reading too early. To give a missing wait the widest window, the first write puts
source row i at slot n-1-i, so the rows the second write reads first (slots 0, 1, ...) are the
ones the first write's last programs produce; n spans many waves of programs.
"""

from __future__ import annotations

import torch

HEADS, HEAD_DIM, NOPE, ROPE = 8, 128, 512, 64


def check_chained_writes(set_mla_kv_buffer, store_cache, n: int = 32768, replays: int = 3) -> None:
    """``set_mla_kv_buffer(buf, loc, nope, rope)`` and ``store_cache(k, v, k_cache, v_cache, loc)``
    (both launched with PDL by the caller's wrappers) chained twice each, eagerly and from a graph."""
    dev, bf16 = "cuda", torch.bfloat16
    buf = torch.full((2 * n, NOPE + ROPE), 3.0, device=dev, dtype=bf16)
    kc, vc = (torch.full((2 * n, HEADS, HEAD_DIM), 5.0, device=dev, dtype=bf16) for _ in range(2))
    nope, rope = torch.empty(n, NOPE, device=dev, dtype=bf16), torch.empty(n, ROPE, device=dev, dtype=bf16)
    k, v = (torch.empty(n, HEADS, HEAD_DIM, device=dev, dtype=bf16) for _ in range(2))
    first = torch.arange(n - 1, -1, -1, device=dev)  # row i -> slot n-1-i
    second = torch.arange(n, 2 * n, device=dev)

    def refill():
        for source in (nope, rope, k, v):
            source.copy_(torch.randn_like(source))

    def step():
        set_mla_kv_buffer(buf, first, nope, rope)
        set_mla_kv_buffer(buf, second, buf[:n, :NOPE], buf[:n, NOPE:])  # sources: what the first wrote
        store_cache(k, v, kc, vc, first)
        store_cache(kc[:n], vc[:n], kc, vc, second)

    def check(what: str):
        want = torch.cat([nope, rope], 1).flip(0)
        assert torch.equal(buf[:n], want), f"{what}: the first MLA write is wrong"
        stale = (buf[n:] != want).any(1).nonzero().flatten()
        assert stale.numel() == 0, f"{what}: the second MLA write read stale rows, first at {stale[:5].tolist()}"
        for name, cache, src in (("k", kc, k), ("v", vc, v)):
            assert torch.equal(cache[:n], src.flip(0)), f"{what}: the first store_cache is wrong ({name})"
            stale = (cache[n:] != src.flip(0)).flatten(1).any(1).nonzero().flatten()
            assert stale.numel() == 0, f"{what}: the second store_cache read stale {name} rows, first at " \
                                       f"{stale[:5].tolist()}"

    refill()
    step()
    torch.cuda.synchronize()
    check("eager")
    graph = torch.cuda.CUDAGraph()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        step()
    for replay in range(replays):
        buf.fill_(3.0)
        kc.fill_(5.0)
        vc.fill_(5.0)
        refill()
        graph.replay()
        torch.cuda.synchronize()
        check(f"graph replay {replay}")

"""Instructions per element of the block-scaled Triton writer, without a GPU: ``block_write``
compiled for sm_90 with Triton's bundled ptxas, disassembled with its nvdisasm, and counted.

    python benchmarks/sass_count.py            # MXFP8 e4m3fn, e5m2 and NVFP4, bf16 sources

Each row is one compile of the kernel as the host launches it for bf16 ``[N, 8, 128]`` sources
into NHD caches with linear scale caches (strides divisible by 16, as Triton specializes them;
a tile of 4096 elements, 4 warps) under one setting of the speed constexprs (``WIDE``,
``HW_FP8``, ``WHOLE``): SASS instructions of the whole kernel, per element of the tile (every
thread runs the kernel once for 32 elements), registers, and the most frequent opcodes. The
writer is bound by instructions, not bytes, so this predicts its GPU time before a device run.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the pointer arguments and their element types; every stride and size Triton would see as
# divisible by 16 in the workload above gets that hint
POINTERS = {"src_ptr": "*i16", "dst_ptr": "*u8", "sc_ptr": "*u8", "idx_ptr": "*i64", "gs_ptr": "*fp32",
            "gs2_ptr": "*fp32", "verdict_ptr": "*i32", "mailbox_ptr": "*i64"}
DIVISIBLE = {"src_s0", "src_s1", "dst_block_stride", "dst_token_stride", "dst_head_stride", "sc_block_stride",
             "sc_token_stride", "block_size", "num_slots", "dim"}
TILE_ELEMENTS, WARPS = 4096, 4


def compile_sm90(fmt: int, **speed):
    """``block_write`` compiled for sm_90 (a triton CompiledKernel)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from oracle.kernels.triton import _block_kernels as bk

    block, nbp = (16, 8) if fmt == bk.FMT_NVFP4 else (32, 4)
    meta = dict(SRC=bk.SRC_BF16, FMT=fmt, BLOCK=block, NBP=nbp, ROWS=TILE_ELEMENTS // (block * nbp), HAS_INDEX=1,
                SWIZZLED=0, CHECK=0, NEGATIVE_OK=1, CHECK_BLOCK=16, SYS_FENCE=0, CHECK_GS=0, **speed)
    names = bk.block_write.arg_names
    signature, constants = {}, {}
    for i, name in enumerate(names):
        if name in meta or name == "src_s2":  # src_s2 == 1: Triton specializes it to a constant
            signature[name] = "constexpr"
            constants[(i,)] = meta.get(name, 1)
        else:
            signature[name] = POINTERS.get(name, "i32")
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(names) if name in POINTERS or name in DIVISIBLE}
    source = ASTSource(fn=bk.block_write, signature=signature, constexprs=constants, attrs=attrs)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": WARPS})


def sass_counts(kernel) -> tuple[collections.Counter, str]:
    """(opcode counts of the kernel's SASS, the registers line of its resource usage)."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
        if m:
            ops[m.group(2).split(".")[0]] += 1
    registers = re.search(r"REG:(\d+)", usage)
    return ops, registers.group(1) if registers else "?"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=6, help="opcodes shown per row")
    opts = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from oracle.kernels.triton import _block_kernels as bk

    per_thread = TILE_ELEMENTS // (32 * WARPS)
    print(f"{'format':<8} {'WIDE':>4} {'HW_FP8':>6} {'WHOLE':>5} {'SASS':>6} {'/elem':>6} {'regs':>5}  top opcodes")
    for name, fmt in (("e4m3fn", bk.FMT_E4M3FN), ("e5m2", bk.FMT_E5M2), ("nvfp4", bk.FMT_NVFP4)):
        for wide, hw, whole in ((1, 0, 0), (0, 0, 1), (0, 1, 1)):
            ops, regs = sass_counts(compile_sm90(fmt, WIDE=wide, HW_FP8=hw, WHOLE=whole))
            total = sum(ops.values())
            top = ", ".join(f"{o} {c}" for o, c in ops.most_common(opts.top))
            print(f"{name:<8} {wide:>4} {hw:>6} {whole:>5} {total:>6} {total / per_thread:>6.1f} {regs:>5}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

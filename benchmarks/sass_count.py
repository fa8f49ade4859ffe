"""Instructions per element of the block-scaled Triton writer, without a GPU: ``block_write``
compiled for sm_90 with Triton's bundled ptxas, disassembled with its nvdisasm, and counted.

    python benchmarks/sass_count.py            # MXFP8 e4m3fn, e5m2 and NVFP4, bf16 sources

Each row is one compile of the kernel as the host launches it for bf16 ``[N, 8, 128]`` sources
into NHD caches with linear scale caches (strides divisible by 16, as Triton specializes them;
the host's tile for the format, ``block_ops.TILE_ELEMENTS``, 4 warps, K and V in one program,
programmatic dependent launch with the L2 prefetch, as on sm_90, no slot check)
under one setting of the speed constexprs (``WIDE``, ``HW_FP8``, ``WHOLE``): SASS instructions
of the whole kernel, those of its plain path (tiles with no NaN and no inf: the special-value
branches left out), the plain path's per source element (every thread runs the kernel once, for
its share of both sides' tiles), registers, and the most frequent opcodes. The writer is bound
by instructions, not bytes, so this predicts its GPU time before a device run.
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
POINTERS = {"src_ptr": "*i16", "dst_ptr": "*u8", "sc_ptr": "*u8", "src2_ptr": "*i16", "dst2_ptr": "*u8",
            "sc2_ptr": "*u8", "idx_ptr": "*i64", "gs_ptr": "*fp32",
            "gs2_ptr": "*fp32", "verdict_ptr": "*i32", "mailbox_ptr": "*i64"}
DIVISIBLE = {"src_s0", "src_s1", "dst_block_stride", "dst_token_stride", "dst_head_stride", "sc_block_stride",
             "sc_token_stride", "block_size", "num_slots", "dim"}
WARPS, SIDES = 4, 2  # K and V in one launch


def compile_sm90(fmt: int, **speed):
    """``block_write`` compiled for sm_90 (a triton CompiledKernel)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from oracle.kernels.triton import _block_kernels as bk
    from oracle.kernels.triton.block_ops import TILE_ELEMENTS

    block, nbp = (16, 8) if fmt == bk.FMT_NVFP4 else (32, 4)
    meta = dict(SRC=bk.SRC_BF16, FMT=fmt, BLOCK=block, NBP=nbp, ROWS=TILE_ELEMENTS[fmt] // (block * nbp), HAS_INDEX=1,
                SWIZZLED=0, CHECK=0, NEGATIVE_OK=1, CHECK_BLOCK=16, SYS_FENCE=0, CHECK_GS=0, HEADS_LOG2=3,
                BS_LOG2=4, SIDES=SIDES, PDL=1, PREFETCH=1, **speed)
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


def sass_counts(kernel) -> tuple[collections.Counter, collections.Counter, str]:
    """(opcode counts of the kernel's SASS, those of its plain path, the registers line of its
    resource usage). The plain path leaves out the special-value branches: the then-blocks of the
    largest if/else structures in the code, one per side (``@!P BRA else`` ... ``BRA join``; a tile with a NaN or an inf
    takes it instead of the else-block), which no tile of ordinary data runs, and the division's
    slow-path subroutine."""
    import triton

    tools = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([os.path.join(tools, "nvdisasm"), "-c", f.name], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([os.path.join(tools, "cuobjdump"), "--dump-resource-usage", f.name],
                               capture_output=True, text=True, check=True).stdout
    lines = sass.splitlines()
    opcodes = [_opcode(line) for line in lines]
    slow = _slow_path_subroutines(lines)
    ops = collections.Counter(op for op in opcodes if op)
    special = _special_branches(lines, SIDES)
    plain = collections.Counter(op for i, op in enumerate(opcodes)
                                if op and not slow[i] and not any(a < i < b for a, b in special))
    registers = re.search(r"REG:(\d+)", usage)
    return ops, plain, registers.group(1) if registers else "?"


def _opcode(line: str) -> str | None:
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)", line)
    return m.group(2).split(".")[0] if m else None


def _slow_path_subroutines(lines: list[str]) -> list[bool]:
    """Per line, whether it belongs to a compiler-emitted slow-path subroutine (the IEEE
    division's, ``$__internal_*_slowpath``: called only for operands out of the fast path's range)."""
    inside, flags = False, []
    for line in lines:
        m = re.match(r"\s*(\S+):\s*$", line)
        if m and not m.group(1).startswith(".L"):
            inside = "slowpath" in m.group(1)
        flags.append(inside)
    return flags


def _special_branches(lines: list[str], count: int) -> list[tuple[int, int]]:
    """(line of the branch, line of the else label) around the ``count`` largest then-blocks of
    if/else structures that do not overlap (one special-value branch per side)."""
    labels = {line.strip()[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\s*\.L_x_\d+:\s*", line)}
    found = []
    for i, line in enumerate(lines):
        m = re.search(r"@!?U?P\w+\s+BRA\s+`\((\.L_x_\d+)\)", line)
        target = labels.get(m.group(1), -1) if m else -1
        # an if/else: the then-block ends in an unconditional jump over the else-block
        if target > i and re.search(r"^\s*/\*[0-9a-f]+\*/\s+BRA\s+`\(\.L_x_\d+\)", lines[target - 1]):
            found.append((i, target))
    chosen = []
    for start, end in sorted(found, key=lambda b: b[0] - b[1]):  # largest first
        if len(chosen) < count and all(end <= a or start >= b for a, b in chosen):
            chosen.append((start, end))
    return chosen


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=6, help="opcodes shown per row")
    opts = parser.parse_args(argv)
    sys.path.insert(0, ROOT)
    from oracle.kernels.triton import _block_kernels as bk

    from oracle.kernels.triton.block_ops import TILE_ELEMENTS

    print(f"{'format':<8} {'WIDE':>4} {'HW_FP8':>6} {'WHOLE':>5} {'SASS':>6} {'plain':>6} {'/elem':>6} {'regs':>5}"
          "  top opcodes of the plain path")
    for name, fmt in (("e4m3fn", bk.FMT_E4M3FN), ("e5m2", bk.FMT_E5M2), ("nvfp4", bk.FMT_NVFP4)):
        for wide, hw, whole in ((1, 0, 0), (0, 0, 1), (0, 1, 1)):
            ops, plain, regs = sass_counts(compile_sm90(fmt, WIDE=wide, HW_FP8=hw, WHOLE=whole))
            total, executed = sum(ops.values()), sum(plain.values())
            top = ", ".join(f"{o} {c}" for o, c in plain.most_common(opts.top))
            per_thread = SIDES * TILE_ELEMENTS[fmt] // (32 * WARPS)
            print(f"{name:<8} {wide:>4} {hw:>6} {whole:>5} {total:>6} {executed:>6} {executed / per_thread:>6.1f} "
                  f"{regs:>5}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

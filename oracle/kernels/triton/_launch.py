"""Launching the Triton kernels on a GPU without the JIT's per-call bookkeeping.

``kernel[grid](*args)`` costs about 20-28 us of host time per call on the H100 host for our
19-argument kernels, against 9-13 us for the same launch through the compiled kernel's own
runner (benchmarks/host_cost.py; docs/benchmarks.md). At N <= 64 (decode) the GPU finishes a
KV write in about a microsecond, so that host time *is* the call's cost.

:class:`CompiledLaunch` keeps the compiled kernel per **Triton's own specialization** of the
arguments (the kernel's binder: dtypes, 16-byte alignment of every pointer, which integers are 1,
divisible by 16 or wider than 32 bits, the constexprs) plus the launch options and the device, and
launches it through ``CompiledKernel.run``. So a call that Triton would compile differently never
reuses another call's binary; what is skipped is the JIT's string cache key, its global-value
check, its launch metadata and device lookups. The first call of each specialization goes
through ``kernel[grid]`` (which compiles, caches on disk and launches), and so does every call
while a launch hook is installed (profilers such as proton read the metadata it builds).

Each launch returns what repeats it (the launcher's C function and its leading arguments), which
:mod:`._plans` keeps to replay a whole writer call without the binder.
"""

from __future__ import annotations

from triton import knobs
from triton.runtime.driver import driver


class CompiledLaunch:
    """``launch(grid, device_index, args, meta)`` runs ``jit_fn[grid](*args, **meta)`` with
    ``meta`` the constexprs (by name, in any order) and ``num_warps``/``num_stages``."""

    def __init__(self, jit_fn):
        self.jit_fn = jit_fn
        flags = [p.is_constexpr for p in jit_fn.params]
        # the runner takes every parameter in signature order; ours put the constexprs last
        if flags != sorted(flags):
            raise ValueError(f"{jit_fn.__name__}: constexpr parameters must come last")
        self.constexprs = [p.name for p in jit_fn.params if p.is_constexpr]
        self.compiled: dict = {}

    def _binder(self, device_index: int):
        # JITFunction.device_caches[device] = (kernel cache, key cache, target, backend, binder)
        return self.jit_fn.device_caches[device_index][4]

    def launch(self, grid: tuple, device_index: int, args: tuple, meta: dict):
        """Launch; return ``(launch, head, tail)`` such that ``launch(gx, gy, gz, *head, *args,
        *tail)`` repeats this launch for arguments of the same specialization on the same stream
        (:mod:`._plans`), or None where a launch hook is installed."""
        if hooks_installed():
            self.jit_fn[grid](*args, **meta)
            return None
        _, specialization, options = self._binder(device_index)(*args, **meta)
        key = (device_index, tuple(specialization), tuple(sorted(options.items())), knobs.runtime.debug)
        entry = self.compiled.get(key)
        if entry is None:
            compiled = self.jit_fn[grid](*args, **meta)  # compiles (or loads) and launches this once
            runner = compiled.run
            # the launcher's C function directly where the kernel needs no scratch memory (ours
            # never do): CudaLauncher.__call__ would only allocate none and pass it on
            direct = getattr(runner, "launch", None)
            if direct is not None and not getattr(runner, "global_scratch_size", 1) \
                    and not getattr(runner, "profile_scratch_size", 1):
                head = (runner.launch_cooperative_grid, runner.launch_pdl, None, None, compiled.packed_metadata)
            else:
                direct, head = None, ()
            self.compiled[key] = entry = (runner, compiled.function, compiled.packed_metadata,
                                          tuple(meta[name] for name in self.constexprs), direct, head)
            stream = driver.active.get_current_stream(device_index)
            return self._replayable(entry, stream)
        run, function, packed, constexprs, _, _ = entry
        stream = driver.active.get_current_stream(device_index)
        # no hooks are installed (checked above): no launch metadata, no hook calls
        run(grid[0], grid[1] if len(grid) > 1 else 1, grid[2] if len(grid) > 2 else 1, stream, function,
            packed, None, None, None, *args, *constexprs)
        return self._replayable(entry, stream)

    @staticmethod
    def _replayable(entry, stream):
        run, function, packed, constexprs, direct, head = entry
        if direct is not None:  # (grid, stream, function, cooperative, pdl, scratch x2, metadata, hooks)
            return direct, (stream, function) + head + (None, None, None), constexprs
        return run, (stream, function, packed, None, None, None), constexprs


def hooks_installed() -> bool:
    """Whether a Triton launch hook is installed (profilers such as proton read the metadata
    Triton's own launch path builds, so we launch through it then)."""
    return _hooked(knobs.runtime.launch_enter_hook) or _hooked(knobs.runtime.launch_exit_hook)


def _hooked(hook) -> bool:
    """Whether a launch hook is installed (a HookChain with calls in triton 3.6, else a callable)."""
    calls = getattr(hook, "calls", hook)
    return bool(calls)


_launchers: dict = {}


def launcher(jit_fn) -> CompiledLaunch:
    """The (one) CompiledLaunch of a kernel."""
    found = _launchers.get(jit_fn)
    if found is None:
        found = _launchers[jit_fn] = CompiledLaunch(jit_fn)
    return found

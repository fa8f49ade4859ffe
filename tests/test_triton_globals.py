"""Every Triton kernel of the project reads only globals the Triton compiler accepts.

The CPU interpreter (``TRITON_INTERPRET=1``, how CI runs the Triton kernels) runs a jit function
as Python, so it reads any module global; the compiler for a GPU accepts only ``tl.constexpr``
instances, modules, jit functions and ``triton.language`` objects, and fails the first launch with
``NameError: Cannot access global variable ...``. This test applies the compiler's rule
(triton/compiler/code_generator.py, ``global_lookup``) to the source of every jit function under
``oracle``, so that such a kernel fails here, not on the first GPU run."""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import pkgutil
import textwrap
import types

import pytest

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

import oracle  # noqa: E402

JIT_TYPES = (JITFunction, InterpretedFunction)  # @triton.jit compiled, or under TRITON_INTERPRET=1


def _modules():
    """Every module under ``oracle`` that imports here (the CUDA backend's need a build: none of
    them holds a Triton kernel)."""
    for info in pkgutil.walk_packages(oracle.__path__, "oracle."):
        if info.name.endswith("__main__"):
            continue
        try:
            yield importlib.import_module(info.name)
        except ImportError:
            continue


def _jit_functions():
    found = []
    for module in _modules():
        for name, value in vars(module).items():
            if isinstance(value, JIT_TYPES) and value.fn.__module__ == module.__name__:
                found.append(pytest.param(value, id=f"{module.__name__}.{name}"))
    return found


JIT_FUNCTIONS = _jit_functions()


def _compiler_accepts(value) -> bool:
    """Whether Triton's code generator lets a jit function read this global (its rule, less the
    escape hatch TRITON_ALLOW_NON_CONSTEXPR_GLOBALS)."""
    return (isinstance(value, (types.ModuleType, *JIT_TYPES, tl.constexpr, tl.dtype))
            or getattr(value, "__triton_builtin__", False)
            or getattr(value, "__triton_aggregate__", False)
            or str(getattr(value, "__module__", "") or "").startswith("triton.language"))


def _globals_read(fn) -> set[str]:
    """Names a function's body loads that it neither binds nor finds among the builtins."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    bound = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    return {n.id for n in ast.walk(tree)
            if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id not in bound
            and not hasattr(builtins, n.id)}


def test_the_project_has_triton_kernels_to_check():
    names = {p.id for p in JIT_FUNCTIONS}
    assert "oracle.kernels.triton._block_kernels.block_write" in names
    assert len(names) >= 10


@pytest.mark.parametrize("kernel", JIT_FUNCTIONS)
def test_a_jit_function_reads_only_globals_the_compiler_accepts(kernel):
    scope = kernel.fn.__globals__
    refused = sorted(name for name in _globals_read(kernel.fn)
                     if name in scope and not _compiler_accepts(scope[name]))
    assert not refused, (f"{kernel.fn.__qualname__} reads module globals that are not tl.constexpr: "
                         f"{', '.join(f'{n} = {scope[n]!r}' for n in refused)}; the GPU compiler refuses them")


def test_the_rule_refuses_a_plain_int_global():
    """Meta: the check fails on the very mistake it exists for."""
    assert not _compiler_accepts(0x7FFFFFFF)
    assert _compiler_accepts(tl.constexpr(0x7FFFFFFF))

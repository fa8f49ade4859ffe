"""Kernel registration and plug-in discovery.

Every kernel, ours included, arrives the same way: a plug-in function, named by an entry point in
the group ``oracle.kernels`` or by ``ORACLE_PLUGINS=package.module:function[,...]``, calls
:func:`oracle.register`. A plug-in that fails to import or registers a bad manifest is recorded
with its name and error; the other plug-ins still load.
"""

from __future__ import annotations

import importlib
import os
import traceback
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Callable

from .contract import Contract

ENTRY_POINT_GROUP = "oracle.kernels"
PLUGINS_ENV = "ORACLE_PLUGINS"


@dataclass(frozen=True)
class Kernel:
    contract: Contract
    fn: Callable
    plugin: str  # where it came from: the entry point or ORACLE_PLUGINS item

    @property
    def name(self) -> str:
        return self.contract.name

    def unavailable(self) -> str | None:
        """None when the kernel can run here, else why not (an exception counts as a reason)."""
        try:
            return self.contract.available()
        except Exception as exc:  # an availability probe must never take the suite down
            return f"available() raised {type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class PluginError:
    plugin: str
    error: str
    detail: str  # the traceback, for the report


class Registry:
    def __init__(self):
        self.kernels: dict[str, Kernel] = {}
        self.errors: list[PluginError] = []
        self._loading = "direct call"
        self._loaded = False

    def register(self, fn: Callable | None = None, *, contract: Contract | None = None, **fields):
        """Register ``fn`` under ``contract`` (or a Contract built from ``fields``).

        Usable directly, ``register(fn, op=..., name=..., backend=...)``, or as a decorator,
        ``@register(op=..., name=..., backend=...)``. Returns ``fn`` so decorators stack.
        """
        if contract is None:
            contract = Contract(**fields)
        elif fields:
            raise TypeError(f"pass either contract= or contract fields, not both (got {sorted(fields)})")
        if fn is None:
            return lambda f: self.register(f, contract=contract)
        if not callable(fn):
            raise TypeError(f"kernel {contract.name!r}: {fn!r} is not callable")
        if contract.name in self.kernels:
            previous = self.kernels[contract.name].plugin
            raise ValueError(f"kernel name {contract.name!r} is already registered by {previous}")
        self.kernels[contract.name] = Kernel(contract, fn, self._loading)
        return fn

    def load_plugin(self, label: str, target: Callable[[], object]) -> None:
        """Run one plug-in, with :func:`oracle.register` routed to this registry; on failure
        record why. Kernels it registered before failing stay."""
        global _loading_into
        self._loading, outer, _loading_into = label, _loading_into, self
        try:
            target()
        except Exception as exc:
            self.errors.append(PluginError(label, f"{type(exc).__name__}: {exc}", traceback.format_exc()))
        finally:
            self._loading, _loading_into = "direct call", outer

    def discover(self) -> "Registry":
        """Load every plug-in once: entry points first, then ORACLE_PLUGINS."""
        if self._loaded:
            return self
        self._loaded = True
        for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            self.load_plugin(f"entry point {ep.name} ({ep.value})", lambda ep=ep: ep.load()())
        for spec in filter(None, (s.strip() for s in os.environ.get(PLUGINS_ENV, "").split(","))):
            self.load_plugin(f"{PLUGINS_ENV} {spec}", lambda spec=spec: _resolve(spec)())
        return self

    def select(self, *, backend: str | None = None, kernel: str | None = None,
               op: str | None = None, origin: str | None = None) -> list[Kernel]:
        """Kernels matching the filters (each a comma-separated list), sorted by op and name.
        ``origin`` "env" keeps only kernels that ORACLE_PLUGINS brought in, "entry-points" only
        installed ones."""
        def wanted(value, spec):
            return spec is None or value in {s.strip() for s in spec.split(",")}

        def came_from(kernel):
            if origin in (None, "all"):
                return True
            from_env = kernel.plugin.startswith(PLUGINS_ENV)
            return from_env if origin == "env" else not from_env

        return sorted((k for k in self.kernels.values()
                       if wanted(k.contract.backend, backend) and wanted(k.name, kernel)
                       and wanted(k.contract.op, op) and came_from(k)),
                      key=lambda k: (k.contract.op, k.name))


def _resolve(spec: str) -> Callable:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not of the form package.module:function")
    target = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise TypeError(f"{spec!r} names {target!r}, which is not callable")
    return target


default_registry = Registry()
_loading_into: Registry | None = None  # the registry whose plug-in is running, if any


def register(fn: Callable | None = None, *, contract: Contract | None = None, **fields):
    """Register a kernel (see :meth:`Registry.register`): into the registry that is loading the
    calling plug-in, else into the default one."""
    return (_loading_into or default_registry).register(fn, contract=contract, **fields)

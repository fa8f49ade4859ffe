"""What the JIT-built kernel libraries (``oracle.kernels.cpu``, ``oracle.kernels.cuda``) share: the
build cache, its lock, loading, the handle a backend's kernels call through (:class:`Library`) and
the fake kernels' check (:func:`need`).

Each library is compiled with ``torch.utils.cpp_extension.load`` (ninja) into a directory named for
a hash of everything that determines it (see :func:`cache_dir`; each backend's ``source_hash``
says what goes in), so a change builds a new library next to the old one and an unchanged one is
never rebuilt.

Concurrent processes (pytest-xdist workers) serialize on an ``fcntl`` lock in the build directory:
the first builds, the others wait and then load the same library. A finished build is marked by a
``READY`` file written last, so a later process loads the library directly, without running ninja
(or needing it). torch's own ``lock`` file, which a killed build would leave behind and on which
every later build would wait forever, is removed while the fcntl lock is held (only a lock holder
ever builds, so such a file is always stale there).

Nothing here raises on a missing toolchain or a failed build: :func:`load` returns None when the
ops are loaded, else the reason they are not, which the kernels' ``available()`` reports.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

READY = "READY"
LOCK_FILE = ".kv-oracle.lock"


@dataclass(frozen=True)
class Extension:
    """One library: its namespace (``torch.ops.<namespace>``), sources and headers in csrc/.
    ``state`` and ``lock`` record what loading it did in this process (see :func:`load`)."""

    namespace: str
    sources: tuple
    headers: tuple
    state: dict = field(default_factory=dict, compare=False, hash=False)
    lock: threading.Lock = field(default_factory=threading.Lock, compare=False, hash=False)


# Headers every extension may include (on each build's include path): the error-message names.
SHARED_CSRC = Path(__file__).resolve().parent / "_csrc"
SHARED_HEADERS = ("messages.h",)


def digest(csrc: Path, names: Iterable[str], parts: Iterable) -> str:
    """16 hex digits of sha256 over the files ``names`` in ``csrc`` and the shared headers (a
    missing one hashes as such) and the ``repr`` of each of ``parts``."""
    h = hashlib.sha256()
    files = [(name, csrc / name) for name in names] + [(f"shared/{n}", SHARED_CSRC / n) for n in SHARED_HEADERS]
    for name, path in files:
        h.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"<missing>") + b"\0")
    for part in parts:
        h.update(repr(part).encode() + b"\0")
    return h.hexdigest()[:16]


def cache_dir(prefix: str, source_hash: str) -> Path:
    """``$XDG_CACHE_HOME/kv-oracle/<prefix>-<torch version>-<source_hash>`` (``~/.cache`` without
    XDG_CACHE_HOME)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    torch_version = torch.__version__.replace("+", "_")
    return Path(root) / "kv-oracle" / f"{prefix}-{torch_version}-{source_hash}"


def load(ext: Extension, *, csrc: Path, what: str, check: Callable[[], str | None],
         directory: Callable[[], Path], library: Callable[[Path], Path],
         build: Callable[[Path], str | None]) -> str | None:
    """Load ``ext``'s ops into this process, building them first if no finished build exists.
    Returns None on success, else the reason (cached: a failure is not retried).

    ``what`` names the kernels in reasons ("C++", "CUDA"); ``check()`` is the backend's reason not
    to build here; ``directory()`` the build directory wanted; ``library(directory)`` the library
    built there; ``build(directory)`` compiles it (with the directory's lock held) and returns
    None or the reason it failed."""
    with ext.lock:
        if "result" not in ext.state:
            ext.state["result"] = _load_once(ext, csrc, what, check, directory, library, build)
        return ext.state["result"]


def _load_once(ext, csrc, what, check, build_dir, library_at, build) -> str | None:
    missing = [name for name in ext.sources + ext.headers if not (csrc / name).is_file()]
    if missing:
        return f"the {what} sources are not installed ({', '.join(missing)} missing in {csrc})"
    reason = check()
    if reason:
        return reason
    wanted = build_dir()
    ext.state["build_dir"] = str(wanted)
    try:
        wanted.mkdir(parents=True, exist_ok=True)
        directory = wanted
    except OSError as exc:  # a read-only home: build in a private temporary directory instead
        directory = Path(tempfile.gettempdir()) / f"kv-oracle-{os.getuid()}" / wanted.name
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError:
            return f"cannot create the build directory {wanted}: {exc}"
        ext.state["build_dir"] = str(directory)
    library = library_at(directory)
    if (directory / READY).is_file() and library.is_file():
        return _load_library(ext, library, built=False)
    import fcntl

    with open(directory / LOCK_FILE, "a+") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes or the process dies
        try:
            if (directory / READY).is_file() and library.is_file():  # another process built it
                return _load_library(ext, library, built=False)
            reason = build(directory)
            if reason:
                return reason
            (directory / (READY + ".tmp")).write_text(library.name + "\n")
            os.replace(directory / (READY + ".tmp"), directory / READY)
            ext.state["built"] = True
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)
    return _load_library(ext, library, built=True)


def compile_library(ext: Extension, directory: Path, *, name: str, csrc: Path, what: str,
                    clip: tuple[int, int], **options) -> str | None:
    """Compile ``ext``'s sources into ``directory/<name>.so`` with ``torch.utils.cpp_extension.load``
    (which also loads it into this process); ``options`` go to it as they are. Call with the
    directory's fcntl lock held. Returns None, else the reason, with the compiler's output cut to
    its first and last ``clip`` characters. Records ``built``, ``build_seconds`` and ``loaded`` in
    ``ext.state``."""
    from torch.utils import cpp_extension

    stale = directory / "lock"
    if stale.exists():  # torch's own lock, left by a killed build; we hold the fcntl lock
        stale.unlink()
    # Only the .so must be fresh: ninja decides from timestamps; the hash in the name covers the rest.
    start = time.perf_counter()
    try:
        cpp_extension.load(
            name=name, sources=[str(csrc / s) for s in ext.sources], extra_include_paths=[str(csrc), str(SHARED_CSRC)],
            build_directory=str(directory), is_python_module=False, **options)
    except Exception as exc:  # a compiler error, a missing header, a link failure
        ext.state["build_seconds"] = round(time.perf_counter() - start, 1)
        text = str(exc).strip()
        head, tail = clip
        if len(text) > head + tail:
            text = text[:head] + "\n...\n" + text[-tail:]
        return f"building the {what} kernels in {directory} failed: {type(exc).__name__}: {text}"
    ext.state.update(built=True, build_seconds=round(time.perf_counter() - start, 1),
                     loaded=str(directory / f"{name}.so"))
    return None


def _load_library(ext: Extension, library: Path, *, built: bool) -> str | None:
    if "loaded" in ext.state:  # compile_library loaded it
        return None
    try:
        torch.ops.load_library(str(library))
    except Exception as exc:
        return f"loading {library} failed: {type(exc).__name__}: {exc}"
    ext.state["loaded"] = str(library)
    ext.state.setdefault("built", built)
    return None


class Library:
    """A backend's handle on its ops: loaded on first use, fake kernels registered, then
    ``torch.ops.<namespace>`` (kept in :attr:`loaded`, which the kernels read first: ``ops()`` is a
    call per launch)."""

    def __init__(self, label: str, namespace: str, load: Callable[[], str | None], fakes: str):
        self.label = label  # "CPU", "CUDA": names the kernels in ops()'s error
        self.namespace = namespace
        self._load = load
        self._fakes = fakes  # the fake-kernel module, imported once the ops exist
        self.loaded = None

    def available(self) -> str | None:
        """None when the kernels are loaded (building them on first use), else why not."""
        if self.loaded is not None:
            return None
        reason = self._load()
        if reason is None:
            importlib.import_module(self._fakes).register_fakes()
            self.loaded = getattr(torch.ops, self.namespace)
        return reason

    def ops(self):
        """``torch.ops.<namespace>``, loading the library first; RuntimeError when unavailable."""
        reason = self.available()
        if reason:
            raise RuntimeError(f"the kv-oracle {self.label} kernels are unavailable: {reason}")
        return self.loaded


def need(cond, message: str, exc: type[Exception] = ValueError) -> None:
    """A fake kernel's check: raise ``exc(message)`` unless ``cond``. (The fakes themselves are
    registered by each backend's ``_fake`` module: torch requires the module the library names in
    ``m.set_python_module`` to make the call.)"""
    if not cond:
        raise exc(message)

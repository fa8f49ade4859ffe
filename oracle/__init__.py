"""kv-oracle: the conformance oracle for LLM-serving KV-cache write kernels.

The executable semantics live in :mod:`oracle.reference` (pure numpy + ml_dtypes). Kernels,
ours and vendors', plug in with :func:`register` and are tested by ``pytest --pyargs conformance``.
"""

__version__ = "0.1.0"

from .contract import Contract, Tolerance  # noqa: E402
from .registry import register  # noqa: E402

__all__ = ["Contract", "Tolerance", "__version__", "register"]

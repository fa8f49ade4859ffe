"""kv-oracle: the conformance oracle for LLM-serving KV-cache write kernels.

The executable semantics live in :mod:`oracle.reference` (pure numpy + ml_dtypes).
"""

__version__ = "0.1.0"

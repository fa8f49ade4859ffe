"""Diagnosis: after a failure, which bug the kernel's memory is the exact result of.

:mod:`.hypothesis` names the bug classes (:data:`CAUSES`) and holds one hypothesis; the op specs
and the generic generators propose hypotheses for a case, and each is replayed through the
reference; where none matches, the difference is summarised by its pattern.
"""

from .hypothesis import CAUSES, Hypothesis

__all__ = ["CAUSES", "Hypothesis"]

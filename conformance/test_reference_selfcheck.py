"""Placeholder until the conformance engine exists: the reference must pass its own golden vectors
before any kernel can be judged against it."""

from oracle.reference.golden import run_golden


def test_reference_passes_golden_vectors():
    results = run_golden()
    assert results, "no golden vectors were run"
    failing = [r for r in results if r.failures]
    assert not failing, failing

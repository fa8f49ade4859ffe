"""Our own kernels, grouped by backend, registered through the public plug-in API.

Empty until the conformance engine exists (see docs/semantics.md for what they will implement).
"""

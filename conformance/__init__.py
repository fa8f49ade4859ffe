"""The differential conformance suite (pytest). Until the conformance engine lands, it holds one
check: the reference agrees with its golden vectors."""

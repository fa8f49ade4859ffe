"""Differential conformance: every registered kernel against the reference, under its contract.

The cases come from oracle.cases (one catalogue for all ops); the kernels from the plug-in
registry (entry points ``oracle.kernels`` and ORACLE_PLUGINS). Options: --oracle-backend,
--oracle-kernel, --oracle-op, --oracle-profile quick|full|exhaustive, --oracle-dump DIR.
"""

import pytest

from oracle.pytest_plugin import check_case


def test_store_cache(request, oracle_case):
    check_case(request, oracle_case)


def test_set_mla_kv_buffer(request, oracle_case):
    check_case(request, oracle_case)


def test_concat_and_cache_mla(request, oracle_case):
    check_case(request, oracle_case)


def test_translate_full_to_swa(request, oracle_case):
    check_case(request, oracle_case)


def test_reshape_and_cache_flash(request, oracle_case):
    check_case(request, oracle_case)


def test_quantize_fp8(request, oracle_case):
    check_case(request, oracle_case)


def test_quantize_block(request, oracle_case):
    check_case(request, oracle_case)


def test_reshape_and_cache_block(request, oracle_case):
    check_case(request, oracle_case)


def test_plugins_load(oracle_plugin_error):
    """A plug-in that fails to import or registers a bad manifest fails here, by name."""
    if oracle_plugin_error is not None:
        pytest.fail(f"plug-in {oracle_plugin_error.plugin} failed to load: {oracle_plugin_error.error}"
                    f"\n{oracle_plugin_error.detail}", pytrace=False)

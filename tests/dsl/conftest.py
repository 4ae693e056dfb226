"""Fixtures of the DSL tests: one streaming TableEnvironment for every test that asks Flink's own parser (a PyFlink
start costs seconds); tests sharing it give their tables names of their own."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def flink_env():
    from common.flink import create_table_env

    return create_table_env(streaming=True)

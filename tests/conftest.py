"""Shared fixtures. Prefect gets a private home and no telemetry before anything imports it."""

from __future__ import annotations

import os
import tempfile

import pytest

_PREFECT_HOME = tempfile.mkdtemp(prefix="tunaflow-prefect-home-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")


@pytest.fixture(scope="session")
def prefect_server():
    """Prefect's temporary local server, entered once per test session (it takes ~13 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def host():
    from schemas import Target

    return Target.host()

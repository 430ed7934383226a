"""Conformance: every ONNX backend case tunaflow imports is built into a library and must match the
expected outputs (rtol 1e-3, atol 1e-4). Cases whose anchor op has no template yet are skipped by name."""

import pytest

from testing.backend_cases import discover
from testing.conformance import check_case

CASES, _ = discover()


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_backend_case(case, host, tmp_path):
    result = check_case(case, host, tmp_path / "lib")
    if result.status == "no-template":
        pytest.skip(result.detail)
    assert result.status == "pass", result.detail

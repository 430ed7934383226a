"""The one place a session's runner is chosen from its options."""

from __future__ import annotations

from schemas.options import MeasureOptions, RunnerSpec
from stages.measure.base import Runner
from stages.measure.runner import LocalRunner


def make_runner(spec: RunnerSpec, options: MeasureOptions) -> Runner:
    """A local runner, or an RPC runner for the devices under `spec.key` (ValueError without a token)."""
    if spec.kind == "local":
        return LocalRunner(options)
    from stages.rpc.client import RPCRunner

    return RPCRunner.from_spec(spec, options)

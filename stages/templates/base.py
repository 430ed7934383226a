"""What every operator template provides. A template module satisfies this protocol."""

from __future__ import annotations

from typing import Protocol

import numpy as np
from llvmlite import ir

from schemas.config import Config
from schemas.target import Target
from schemas.task import TuningTask
from stages.templates.space import ConfigSpace, Knobs


class Template(Protocol):
    NAME: str
    VERSION: int
    CLI_OPTIONS: tuple[str, ...]

    def task_from_cli(self, opts: dict) -> TuningTask:
        """The task `tunaflow tune-op NAME --opt value ...` means; ValueError names what is missing."""

    def space(self, task: TuningTask, target: Target) -> ConfigSpace: ...

    def default_config(self, task: TuningTask, target: Target) -> Config: ...

    def build_ir(self, task: TuningTask, knobs: Knobs, target: Target, threads: int = 1) -> ir.Module:
        """A module exporting `tf_main(ptr args)` and the `tf_bench` harness."""

    def make_inputs(self, task: TuningTask, seed: int = 0) -> list[np.ndarray]: ...

    def kernel_args(self, task: TuningTask, knobs: Knobs, inputs: list[np.ndarray]) -> list[np.ndarray]:
        """Buffers for `tf_main` (weights packed as the config wants); the output is last."""

    def reference(self, task: TuningTask, inputs: list[np.ndarray]) -> np.ndarray: ...

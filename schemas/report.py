"""What a tuning run reports: per task, per operator session and per model, for the CLI, `--json`, the
flows' return values and their artifacts alike (one report, every view)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from schemas.measure import Noise
from schemas.target import Target


class TaskReport(BaseModel):
    """One task after tuning: its best record (by the log's rank) against its default schedule's."""

    model_config = ConfigDict(frozen=True)

    task: str
    task_signature: str
    weight: int = 1
    trials: int
    new_trials: int
    wall_s: float
    best_gflops: float
    best_latency_ms: float | None
    best_config: dict[str, int | str] | None
    best_spread: float | None
    default_gflops: float | None  # None: the log holds no trial of the default schedule
    speedup_over_default: float | None
    errors: dict[str, int]
    built: bool | None = None  # in a model: whether the library runs this task's kernel (of a conv and its twin)
    remeasured: bool = False  # the best's figure combines its trials with interleaved re-measurement rounds
    rounds: int = 0  # re-measurement rounds this session ran (0: none)
    rounds_cv: float | None = None  # CV of the best config's round medians
    unstable: bool = False  # the best's last rounds still varied more than the stable CV (see remeasure.py)
    repeat_cv: float | None = None  # median CV of the repeats of this session's trials
    noise: Noise | None = None  # how busy the machine was during the re-measurement


class OpReport(TaskReport):
    """`tune-op`'s result: the task's report plus the numpy reference and where things were written."""

    target_key: str
    target: Target
    numpy_gflops: float | None  # None: numpy could not run where the candidates did (`numpy_note` says why)
    numpy_note: str | None = None
    log: str
    chart: str | None


class RefinedOp(BaseModel):
    """One op's in-model verdict: its candidates' seconds per call inside the model, the ranking's pick first."""

    model_config = ConfigDict(frozen=True)

    task: str
    nodes: int
    candidates: tuple[str, ...]  # each candidate's task and config, in the order of `in_model_ms`
    record_ms: tuple[float, ...]  # each candidate's time alone (its record)
    in_model_ms: tuple[float, ...]  # each candidate's median time inside the model
    chosen: int  # the index of the fastest in the model: 0 keeps the ranking's pick


class RefineReport(BaseModel):
    """`refine`'s result: the ops timed inside the model and what changed."""

    model_config = ConfigDict(frozen=True)

    ops: list[RefinedOp]
    variants: int  # libraries built, each running every op's n-th candidate
    rounds: int  # timing rounds, each over every variant at every workspace address
    seconds: float
    skipped: str | None = None  # why nothing was timed
    dropped: list[str] = []  # variants whose outputs disagreed with the first's: their candidates are not judged

    @property
    def changed(self) -> list[RefinedOp]:
        return [op for op in self.ops if op.chosen != 0]

    @property
    def saved_ms(self) -> float:
        """Per inference, what the verdicts save over the ranking's picks (each op's nodes counted)."""
        return sum(op.nodes * (op.in_model_ms[0] - op.in_model_ms[op.chosen]) for op in self.ops)


class ModelReport(BaseModel):
    """`tune`'s result: every task's report, the built library's summary and, when asked, its latency
    against the default-schedule build (and onnxruntime when installed), measured interleaved."""

    model: str
    log: str
    target: Target
    charts: list[str]
    fallback: str | None
    tasks: list[TaskReport]
    build: dict
    latency: dict[str, dict] | None = None
    refine: RefineReport | None = None

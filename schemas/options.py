"""Options a user sets for a tuning session; the defaults are the README's."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

CacheMode = Literal["auto", "hot", "weights", "cold"]


class ImportLimits(BaseModel):
    """How much memory a model's import may make it allocate (stages/extract/budget.py): the constants folding
    computes (None: the larger of 256 MB and 4x the model's own tensors) and each run-time tensor (float32)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_constant_mb: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    max_tensor_mb: float = Field(default=4096, gt=0, allow_inf_nan=False)


class MeasureOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    number: int = Field(default=1, ge=1, description="calls per repeat (raised by min_repeat_ms)")
    repeat: int = Field(default=3, ge=1, description="timed repeats; the median is the cost")
    min_repeat_ms: float = Field(default=10.0, ge=0, description="a repeat lasts at least this long")
    timeout: float = Field(default=10.0, gt=0, description="seconds before a run is killed")
    build_timeout: float = Field(default=30.0, gt=0, description="seconds before a build is abandoned")
    cache: CacheMode = Field(default="auto", description=(
        "cache state each timed call starts from: `hot` (the previous call's, as in a tight loop), `weights` "
        "(the kernel's weights flushed from every cache level, its activations hot: a layer's state in a model), "
        "`cold` (a 64 MiB buffer written first: nothing cached), or `auto` (per kernel, stages/measure/cache.py)"))
    cooldown_ms: float = Field(default=0.0, ge=0)
    n_parallel: int = Field(default=0, ge=0, description="build processes; 0 means one per core")
    threads: int = Field(default=1, ge=1, le=256, description="threads each kernel runs with")
    memory_limit_mb: int = Field(default=4096, ge=64, description="data memory a measured kernel may allocate")
    fault_rate: float = Field(default=0.0, ge=0, le=1, description="testing: share of candidates made to misbehave")
    fault_seed: int = Field(default=0, description="testing: which candidates misbehave")


class RunnerSpec(BaseModel):
    """Where candidates are measured: here (`local`), or on devices under `key` at an RPC tracker."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["local", "rpc"] = "local"
    key: str = Field(default="", max_length=64, pattern=r"^[A-Za-z0-9_.-]*$")
    host: str = "127.0.0.1"
    port: int = Field(default=9190, ge=1, le=65535)
    token_file: str | None = Field(default=None, description="else the TUNAFLOW_RPC_TOKEN variable")
    scheme: Literal["http", "https"] = "http"
    tls_ca: str | None = Field(default=None, description="CA file an https tracker's certificate is verified with")

    @model_validator(mode="after")
    def _rpc_needs_key(self) -> RunnerSpec:
        if self.kind == "rpc" and not self.key:
            raise ValueError("an rpc runner needs a device key (--key)")
        return self


class TuningOptions(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    n_trials: int = Field(default=64, ge=1)
    early_stopping: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=16, ge=1)
    tuner: Literal["lgbm", "lgbm-reg", "lgbm-rank", "ga", "random", "grid"] = "lgbm"
    epsilon: float = Field(default=0.05, ge=0, le=1, description="share of a model-based batch that is random")
    transfer_from: tuple[str, ...] = Field(default=(), description="logs whose records of the same op seed the model")
    timeout_s: float | None = Field(default=None, gt=0, description="wall-clock budget")
    top_k_remeasure: int = Field(default=3, ge=0)
    refine_top_k: int = Field(default=3, ge=0, description=(
        "after tuning a model, time each op's top records (this many) inside the built model and build the "
        "fastest there (stages/refine); 0 or 1: off"))
    seed: int = 0
    measure: MeasureOptions = MeasureOptions()
    runner: RunnerSpec = RunnerSpec()

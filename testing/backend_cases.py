"""The ONNX backend test cases shipped inside the installed `onnx` package, as conformance tests.

A case is a directory with `model.onnx` and `test_data_set_0/{input,output}_N.pb`. `discover()`
splits the cases into those tunaflow imports (every op supported, float32 inputs, static shapes)
with their inputs and expected outputs loaded as numpy, and the rest with the reason each is out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from schemas.errors import ModelError
from stages.extract.onnx_import import load_model
from stages.graph.ir import Graph

SUITES = ("node", "pytorch-converted", "pytorch-operator", "simple")
DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"


@dataclass(frozen=True)
class BackendCase:
    suite: str
    name: str
    model: Path
    inputs: dict[str, np.ndarray]
    outputs: dict[str, np.ndarray]

    @property
    def id(self) -> str:
        return f"{self.suite}/{self.name}"

    def graph(self) -> Graph:
        return load_model(self.model, name=self.name)


def _tensor(path: Path) -> np.ndarray:
    t = onnx.TensorProto()
    t.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(t)


def _load(suite: str, case_dir: Path) -> BackendCase:
    proto = onnx.load(str(case_dir / "model.onnx"), load_external_data=False)
    inits = {t.name for t in proto.graph.initializer}
    in_names = [v.name for v in proto.graph.input if v.name not in inits]
    data = case_dir / "test_data_set_0"
    inputs = {n: _tensor(data / f"input_{i}.pb") for i, n in enumerate(in_names)}
    outputs = {o.name: _tensor(data / f"output_{i}.pb") for i, o in enumerate(proto.graph.output)}
    return BackendCase(suite, case_dir.name, case_dir / "model.onnx", inputs, outputs)


def discover(suites: tuple[str, ...] = SUITES) -> tuple[list[BackendCase], dict[str, str]]:
    """(cases tunaflow imports, {case id: why it is out}) for the suites present in this onnx."""
    cases: list[BackendCase] = []
    skipped: dict[str, str] = {}
    for suite in suites:
        root = DATA / suite
        if not root.is_dir():
            continue
        for case_dir in sorted(p for p in root.iterdir() if (p / "model.onnx").is_file()):
            if not (case_dir / "test_data_set_0").is_dir():
                skipped[f"{suite}/{case_dir.name}"] = "no test data"
                continue
            case = _load(suite, case_dir)
            try:
                graph = case.graph()
            except ModelError as exc:
                skipped[case.id] = str(exc).replace("\n", " ")
                continue
            bad = [n for n, a in case.inputs.items() if a.dtype != np.float32 or a.shape != graph.values[n].shape]
            if bad:
                skipped[case.id] = f"inputs {bad} are not float32 with the declared shape"
                continue
            cases.append(case)
    return cases, skipped

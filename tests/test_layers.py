"""Imports run one way: a stage may import schemas, its own layer and the layers before it in the chain
graph -> tasks -> spaces -> configs -> IR -> measurements -> log -> build, and nothing outside the stages
(Prefect, flows, the CLI, test harnesses). Read from the source with `ast`, so an import inside a function
counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHAIN = ("graph", "tasks", "spaces", "configs", "IR", "measurements", "log", "build")

# Each stages package (or module) and its place in the chain; the longest matching prefix wins.
LAYERS: dict[str, str] = {
    "stages.extract": "graph",
    "stages.graph": "graph",
    "stages.graph.tasks": "tasks",
    "stages.templates": "spaces",  # a template defines a task's space and turns a config into IR
    "stages.codegen": "spaces",  # the templates' IR toolkit
    "stages.search": "configs",
    "stages.cost_model": "configs",
    "stages.memops": "IR",  # generated memory-bound ops
    "stages.measure": "measurements",
    "stages.rpc": "measurements",
    "stages.log": "log",
    "stages.build": "build",
    "stages.runtime": "build",
    "stages.tune": "build",
    "stages.report": "build",
    "stages.refine": "build",  # the log's top records timed inside a built library, the verdict logged
    "stages.pipeline": "build",  # the pipelines every entry point runs: extract, tune, build, report
}

OUTSIDE_STAGES = ("prefect", "flows", "tunaflow", "testing")
PROJECT = ("stages", "flows", "tunaflow", "testing")


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name: str) -> bool:
    base = ROOT.joinpath(*name.split("."))
    return base.with_suffix(".py").is_file() or base.is_dir()


def imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) for every import in `path`."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    return resolve(ast.parse(path.read_text(), str(path)), package)


def resolve(tree: ast.AST, package: str) -> list[tuple[int, str]]:
    """(line, module) per import in `tree`, relative ones resolved against `package`; `from a import b`
    names `a.b` when `b` is a module, so `from stages.graph import tasks` is an import of the tasks stage."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else base))
    return found


def layer_of(module: str) -> str | None:
    keys = [k for k in LAYERS if module == k or module.startswith(k + ".")]
    return LAYERS[max(keys, key=len)] if keys else None


def sources(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def where(path: Path, line: int, module: str) -> str:
    return f"{path.relative_to(ROOT)}:{line} -> {module}"


def upward_imports() -> list[str]:
    """Every import in stages/ of a stage later in the chain than the importer's own."""
    offenders = []
    for path in sources("stages"):
        own = layer_of(module_name(path))
        if own is None:
            continue
        for line, module in imports(path):
            theirs = layer_of(module)
            if theirs is not None and CHAIN.index(theirs) > CHAIN.index(own):
                offenders.append(f"{where(path, line, module)}  ({own} imports {theirs})")
    return offenders


def test_every_stage_has_a_place_in_the_chain() -> None:
    unplaced = sorted({module_name(p) for p in sources("stages")
                       if p != ROOT / "stages" / "__init__.py" and layer_of(module_name(p)) is None})
    assert not unplaced, f"place these in LAYERS (tests/test_layers.py): {unplaced}"


def test_no_stage_imports_a_later_stage() -> None:
    offenders = upward_imports()
    assert not offenders, f"{len(offenders)} upward imports:\n" + "\n".join(offenders)


def test_stages_import_nothing_outside_the_stages() -> None:
    offenders = [where(p, line, m) for p in sources("stages") for line, m in imports(p)
                 if m.split(".")[0] in OUTSIDE_STAGES]
    assert not offenders, f"{len(offenders)} imports of {OUTSIDE_STAGES} from stages/:\n" + "\n".join(offenders)


def test_schemas_import_no_project_package() -> None:
    offenders = [where(p, line, m) for p in sources("schemas") for line, m in imports(p)
                 if m.split(".")[0] in PROJECT]
    assert not offenders, f"{len(offenders)} imports of {PROJECT} from schemas/:\n" + "\n".join(offenders)


def test_the_checker_resolves_every_form_of_import() -> None:
    """Neither `from stages.graph import tasks` nor a relative import escapes the checks above."""
    tree = ast.parse("import os\nfrom stages.graph import tasks\nfrom ..log import TuningLog\nfrom . import ir\n")
    assert resolve(tree, "stages.graph") == [(1, "os"), (2, "stages.graph.tasks"), (3, "stages.log"),
                                            (4, "stages.graph.ir")]
    assert layer_of("stages.graph.tasks") == "tasks" and layer_of("stages.graph.ir") == "graph"
    assert layer_of("stages.tune.session") == "build" and layer_of("stagesx") is None

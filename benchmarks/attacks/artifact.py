"""Issue 21, group 2: the manifest that vouched for itself, attacked through `tunaflow run` on a real build.

The bundled MLP is built once with TUNAFLOW_ARTIFACT_KEY set (so manifest.sig is written), copied, and
each copy edited as an attacker would: the manifest's digests emptied, its shapes, workspace, weights
size, ops and format version edited (digests left intact or recomputed), model.so replaced by a library
whose constructor writes a marker file (facts missing, or copied from the honest library; digest
recomputed; with and without the key required), one that needs a foreign library, one swapped in after
the check, a truncated one; then buffers of the wrong shape, dtype or size passed to the API. Each
artifact attack runs `tunaflow run --profile 1` in its own process; `code_runs` counts markers that
appeared.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np

from attacks import Outcome
from schemas import Target
from schemas.manifest import KEY_ENV, LIBRARY, SIGNATURE, WEIGHTS
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import load
from stages.runtime.loader import Model, read_manifest, verify
from testing import tamper_artifact as ta
from testing.cli import tunaflow

ROOT = Path(__file__).resolve().parents[2]
GROUP = 2
KEY = "bench-artifact-key-0123456789"


def run(tmp: Path) -> list[Outcome]:
    base = tmp / "base"
    build_library(optimize(load_model(ROOT / "data" / "models" / "mlp.onnx")), Target.host(), base, key=KEY)
    a = _Attacks(base, tmp)
    return [
        a.manifest('`"files": {}` in manifest.json, then workspace_bytes 64',
                   lambda d: d.update(files={}, workspace_bytes=64)),
        a.manifest("input shape halved in manifest.json (digests intact)",
                   lambda d: d["inputs"][0].update(shape=[8, 784])),
        a.manifest("output shape halved in manifest.json (digests intact)",
                   lambda d: d["outputs"][0].update(shape=[8, 10])),
        a.manifest("workspace_bytes 64 in manifest.json (digests intact)", lambda d: d.update(workspace_bytes=64)),
        a.short_weights(),
        a.manifest("ops trimmed to one in manifest.json (tf_profile's seconds buffer), then --profile",
                   lambda d: d.update(ops=d["ops"][:1])),
        a.manifest("format_version 99 in manifest.json", lambda d: d.update(format_version=99)),
        a.manifest("format_version 1 (an artifact of the old format)", lambda d: d.update(format_version=1)),
        a.forged("model.so replaced by a constructor library, digest recomputed (no key required)",
                 copy_facts=False),
        a.forged("constructor library with the honest facts copied in, digest recomputed, key required "
                 "(stale manifest.sig)", key=True),
        a.forged("the same, key required, manifest.sig deleted", key=True, signature="removed"),
        a.forged("the same, key required, manifest.sig made with the attacker's key", key=True, signature="attacker"),
        a.foreign_dependency(),
        a.swapped_after_check(),
        a.truncated(),
        a.wrong_buffers(),
    ]


class _Attacks:
    def __init__(self, base: Path, tmp: Path):
        self.base, self.tmp, self.n = base, tmp, 0

    def _copy(self) -> Path:
        self.n += 1
        return ta.copy(self.base, self.tmp / f"a{self.n}")

    def manifest(self, attack: str, edit: Callable[[dict], None]) -> Outcome:
        lib = self._copy()
        ta.edit_manifest(lib, edit)
        return _judge(attack, lib, *_tunaflow_run(lib))

    def short_weights(self) -> Outcome:
        lib = self._copy()
        data = (lib / WEIGHTS).read_bytes()
        (lib / WEIGHTS).write_bytes(data[:len(data) // 2])
        ta.edit_manifest(lib, lambda d: d.update(weights_bytes=len(data) // 2), redigest=True)
        return _judge("weights.bin halved, weights_bytes halved, digests recomputed", lib, *_tunaflow_run(lib))

    def forged(self, attack: str, copy_facts: bool = True, key: bool = False, signature: str = "stale") -> Outcome:
        lib = self._copy()
        marker = lib.parent / f"{lib.name}-constructor-ran"
        ta.forge_library(lib, marker, copy_facts=copy_facts)
        ta.edit_manifest(lib, lambda d: None, redigest=True)
        if signature == "removed":
            (lib / SIGNATURE).unlink()
        elif signature == "attacker":
            ta.sign(lib, b"the-attackers-own-key")
        return _judge(attack, lib, *_tunaflow_run(lib, KEY if key else None), markers=(marker,))

    def foreign_dependency(self) -> Outcome:
        lib = self._copy()
        marker, own = lib.parent / f"{lib.name}-helper-ran", lib.parent / f"{lib.name}-constructor-ran"
        helper = ta.helper_library(lib.parent / f"{lib.name}-helper.so", marker)
        ta.forge_library(lib, own, needs=helper)
        ta.edit_manifest(lib, lambda d: None, redigest=True)
        return _judge("model.so (honest facts copied, digest recomputed) needs a foreign library with a "
                      "constructor (no key required)", lib, *_tunaflow_run(lib), markers=(marker, own))

    def swapped_after_check(self) -> Outcome:
        """In this process: verify, then replace model.so on disk, then load what was verified."""

        lib = self._copy()
        marker = lib.parent / f"{lib.name}-constructor-ran"
        checked = verify(lib, read_manifest(lib))
        ta.forge_library(lib, marker)
        x = np.random.default_rng(0).standard_normal((16, 784)).astype(np.float32)
        same = bool(np.array_equal(Model(checked)(x), load(self.base)(x)))
        ran = int(marker.exists())
        return Outcome(GROUP, "model.so replaced by a constructor library between the digest check and dlopen",
                       f"the checked bytes were loaded (outputs {'equal' if same else 'DIFFER from'} the honest "
                       f"library's), constructor {'RAN' if ran else 'never ran'}", held=same and not ran,
                       code_runs=ran)

    def truncated(self) -> Outcome:
        lib = self._copy()
        (lib / LIBRARY).write_bytes((lib / LIBRARY).read_bytes()[:3000])
        ta.edit_manifest(lib, lambda d: None, redigest=True)
        return _judge("model.so truncated to 3000 bytes, digest recomputed (dlopen of it died of SIGBUS)", lib,
                      *_tunaflow_run(lib))

    def wrong_buffers(self) -> Outcome:
        cases = [([([16, 785], "float32")], False), ([([16, 784], "float64")], False),
                 ([([6272], "float32")], False), ([([8, 784], "float32")], True), ([([16, 784], "int32")], True)]
        tries = [ta.attempt(self.base, feeds=feeds, profile=profile) for feeds, profile in cases]
        refused = sum(t.refused is not None for t in tries)
        crashes = sum(t.crashed for t in tries)
        first = next((t.refused for t in tries if t.refused), "none refused")
        return Outcome(GROUP, "Model.run / Model.profile given buffers of the wrong shape, dtype or size (5 cases)",
                       f"{refused}/{len(tries)} refused, e.g. {first}", held=refused == len(tries) and not crashes,
                       crashes=crashes)


def _tunaflow_run(lib: Path, key: str | None = None) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    if key is not None:
        env[KEY_ENV] = key
    try:
        proc = tunaflow("run", lib, "--profile", "1", "--json", timeout=120, env=env)
    except subprocess.TimeoutExpired:
        return -1, "", "hung for 120 s"
    return proc.returncode, proc.stdout, proc.stderr


def _judge(attack: str, lib: Path, code: int, stdout: str, stderr: str, markers: tuple[Path, ...] = ()) -> Outcome:
    """Held: exit 2 with one clear error line, no traceback, no planted code run."""
    ran = sum(m.exists() for m in markers)
    crashed = code not in (0, 2) or "Traceback" in stderr
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    said = (lines[-1] if lines else stdout.strip()[:160]).replace(str(lib), "OUT")
    outcome = f"exit {code}: {said}" + (f"; {ran} planted constructor(s) RAN" if ran else "")
    return Outcome(GROUP, attack, outcome, held=code == 2 and not crashed and not ran and len(lines) == 1,
                   crashes=int(crashed), code_runs=ran)

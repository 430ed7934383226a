"""Hostile artifacts: a built library's directory edited as an attacker (or an accident) would, and each
edit loaded and called in a child process, where an out-of-bounds access kills only the child.

The documented failure of a load or a call is `LoadError`; a child that dies of a signal, raises
anything else, or runs code the edit planted (its marker file appears) is a bug. Used by
tests/test_artifact_trust.py and benchmarks/attacks/artifact.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from schemas.manifest import KEY_ENV, LIBRARY, MANIFEST, SIGNATURE, WEIGHTS, file_digest, signature
from stages.build.facts import SECTION, SYMBOL
from stages.runtime.elf import Elf

REFUSED = 3  # the child's exit code for a LoadError
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Attempt:
    """What a child that loaded (and called) an artifact did."""

    returncode: int
    refused: str | None  # the LoadError's message
    outputs: dict | None  # output name -> shape, when the call ran
    stderr: str

    @property
    def crashed(self) -> bool:
        return self.returncode not in (0, REFUSED)

    def summary(self) -> str:
        if self.refused is not None:
            return f"refused: {self.refused}"
        if self.crashed:
            tail = self.stderr.strip().splitlines()[-1:] or ["no output"]
            return f"child died (exit {self.returncode}): {tail[0]}"
        return f"loaded and ran: outputs {self.outputs}"


def copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_manifest(lib: Path, edit: Callable[[dict], None], redigest: bool = False) -> None:
    """Apply `edit` to manifest.json's data; `redigest`: first recompute the digests of the files as they
    are now, as a forger would (an `edit` of `files` still has the last word)."""
    data = json.loads((lib / MANIFEST).read_text())
    if redigest:
        data["files"] = {LIBRARY: file_digest(lib / LIBRARY), WEIGHTS: file_digest(lib / WEIGHTS)}
    edit(data)
    (lib / MANIFEST).write_text(json.dumps(data, indent=1))


def sign(lib: Path, key: bytes) -> None:
    """manifest.sig for the manifest as it is now (under `key`: the attacker's own, say)."""
    (lib / SIGNATURE).write_text(signature((lib / MANIFEST).read_bytes(), key) + "\n")


def forge_library(lib: Path, marker: Path, copy_facts: bool = True, needs: Path | None = None,
                  exported: bytes | None = None, cc: str = "cc") -> Path:
    """Replace model.so by a library whose constructor writes `marker` when it is loaded: with the honest
    library's facts section copied in (`copy_facts`), a DT_NEEDED on the library `needs`, and `exported`
    as its `tf_facts` symbol instead of the section (a file that says one thing and a library another)."""
    facts = Elf((lib / LIBRARY).read_bytes()).section(SECTION) if copy_facts else None
    src = lib.parent / f"{lib.name}-forged.c"
    src.write_text(_constructor_source(marker) + (_facts_source(facts, exported) if facts else ""))
    extra = ["-Wl,--no-as-needed", str(needs)] if needs is not None else []
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib / LIBRARY), str(src), *extra], check=True,
                   capture_output=True)
    return lib / LIBRARY


def helper_library(dest: Path, marker: Path, cc: str = "cc") -> Path:
    """A bare shared library whose constructor writes `marker`: what a forged model.so could DT_NEEDED."""
    src = dest.with_suffix(".c")
    src.write_text(_constructor_source(marker))
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(dest), str(src)], check=True, capture_output=True)
    return dest


def _c_bytes(data: bytes) -> str:
    return "{" + ",".join(str(b) for b in data) + "}"


def _constructor_source(marker: Path) -> str:
    path = os.fsencode(marker) + b"\0"
    return ("#include <stdio.h>\n"
            f"static const char marker[] = {_c_bytes(path)};\n"
            "__attribute__((constructor)) static void planted(void) {\n"
            "  FILE *f = fopen(marker, \"w\");\n"
            "  if (f) { fputs(\"ran\", f); fclose(f); }\n"
            "}\n"
            "void tf_run(void **in, void **out, char *w, char *ws) { (void)in; (void)out; (void)w; (void)ws; }\n")


def _facts_source(section: bytes, exported: bytes | None) -> str:
    placed = f'__attribute__((used, section("{SECTION}"))) '
    if exported is None:
        return f"{placed}const char {SYMBOL}[{len(section)}] = {_c_bytes(section)};\n"
    return (f"{placed}static const char in_section[{len(section)}] = {_c_bytes(section)};\n"
            f"const char {SYMBOL}[{len(exported)}] = {_c_bytes(exported)};\n")


def attempt(lib: Path, key: str | None = None, feeds: list[tuple[list[int], str]] | None = None,
            profile: bool = False, timeout: float = 120) -> Attempt:
    """Load `lib` in a child (TUNAFLOW_ARTIFACT_KEY=`key` when given) and call it once: on zeros shaped as
    the loaded model says, or on `feeds` (shape, dtype per input); `profile`: through `Model.profile`."""
    env = {k: v for k, v in os.environ.items() if k != KEY_ENV}
    if key is not None:
        env[KEY_ENV] = key
    spec = json.dumps({"lib": str(lib), "feeds": feeds, "profile": profile})
    try:
        proc = subprocess.run([sys.executable, "-m", "testing.tamper_artifact", spec], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        return Attempt(-1, None, None, f"hung for {timeout:.0f} s\n{exc.stderr or ''}")
    last = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []
    try:
        said = json.loads(last[0]) if last else {}
    except ValueError:
        said = {}
    return Attempt(proc.returncode, said.get("refused"), said.get("outputs"), proc.stderr)


def _child(spec: dict) -> int:
    """Load, call once, say what happened as one JSON line: exit 0 ran, REFUSED for a LoadError."""
    import numpy as np

    from stages.runtime import LoadError, load

    try:
        model = load(spec["lib"])
        shapes = spec["feeds"] or [(list(i.shape), i.dtype) for i in model.inputs]
        feeds = [np.zeros(shape, dtype=dtype) for shape, dtype in shapes]
        if spec["profile"]:
            model.profile(1, *feeds, warmup=0)
            outputs = {}
        else:
            outputs = {k: list(v.shape) for k, v in model.run(*feeds).items()}
    except LoadError as exc:
        print(json.dumps({"refused": str(exc)}))
        return REFUSED
    print(json.dumps({"outputs": outputs}))
    return 0


if __name__ == "__main__":
    sys.exit(_child(json.loads(sys.argv[1])))

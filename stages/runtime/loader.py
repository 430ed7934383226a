"""`load(OUT)` → a `Model` callable on numpy arrays.

Loading refuses, with a message that says what to do: an artifact whose files do not match
the manifest's digests, and a CPU that lacks a feature the library was compiled for.
Calling refuses inputs of the wrong shape or dtype instead of reading past a buffer.
"""

from __future__ import annotations

import ctypes
import json
import math
import time
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from stages.build.manifest import LIBRARY, MANIFEST, PROFILE, WEIGHTS, Manifest, OpInfo, TensorInfo, file_digest
from stages.build.memplan import ALIGN


class LoadError(Exception):
    """The artifact cannot be loaded (or called) safely; the message names the reason."""


def host_features() -> set[str]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return {f for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}


def missing_features(required: str, host: set[str]) -> list[str]:
    return sorted(f[1:] for f in required.split(",") if f.startswith("+") and f not in host)


def read_manifest(out: Path) -> Manifest:
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise LoadError(f"{out}: no {MANIFEST}; not a directory written by `tunaflow build`")
    try:
        return Manifest.model_validate(json.loads(path.read_text()))
    except (ValueError, ValidationError) as exc:
        raise LoadError(f"{path}: not a valid manifest ({exc})") from exc


def verify(out: Path, manifest: Manifest) -> None:
    for name, digest in manifest.files.items():
        path = Path(out) / name
        if not path.is_file():
            raise LoadError(f"{path} is missing")
        actual = file_digest(path)
        if actual != digest:
            raise LoadError(f"{path} does not match the manifest (sha256 {actual[:12]}..., manifest says "
                            f"{digest[:12]}...): the artifact was modified or is incomplete; rebuild it")


class Model:
    """A loaded library. Not re-entrant: one call at a time per Model (it owns one workspace)."""

    def __init__(self, out: Path, manifest: Manifest):
        self.path, self.manifest = Path(out), manifest
        self._lib = ctypes.CDLL(str(self.path / LIBRARY))
        vpp = ctypes.POINTER(ctypes.c_void_p)
        self._run = self._lib.tf_run
        self._run.argtypes = [vpp, vpp, ctypes.c_void_p, ctypes.c_void_p]
        self._run.restype = None
        self._weights = _aligned_empty(manifest.weights_bytes)
        with open(self.path / WEIGHTS, "rb") as f:  # straight into place: ResNet-50's 100 MB 0.37 -> 0.04 s
            if f.readinto(self._weights) != manifest.weights_bytes:
                raise LoadError(f"{self.path / WEIGHTS} is shorter than the manifest says; rebuild the library")
        self._work = _aligned_empty(manifest.workspace_bytes)
        # Addresses and pointer-array types fixed once: a call then costs a few microseconds of Python.
        self._fixed = (self._weights.ctypes.data, self._work.ctypes.data)
        self._in_array = ctypes.c_void_p * max(1, len(manifest.inputs))
        self._out_array = ctypes.c_void_p * max(1, len(manifest.outputs))
        self._in_specs = [(i.name, np.dtype(i.dtype), tuple(i.shape)) for i in manifest.inputs]
        self._out_specs = [(o.name, np.dtype(o.dtype), tuple(o.shape)) for o in manifest.outputs]

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.manifest.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self.manifest.outputs

    def _feeds(self, args: tuple, named: dict) -> list[np.ndarray]:
        if args and named:
            raise LoadError("give inputs either by position or by name, not both")
        if args:
            if len(args) != len(self.inputs):
                raise LoadError(f"the model takes {len(self.inputs)} input(s) "
                                f"({', '.join(i.name for i in self.inputs)}), got {len(args)}")
            named = {i.name: a for i, a in zip(self.inputs, args, strict=True)}
        if len(named) != len(self._in_specs) or any(name not in named for name, _, _ in self._in_specs):
            missing = [i.name for i in self.inputs if i.name not in named]
            extra = sorted(set(named) - {i.name for i in self.inputs})
            raise LoadError(f"inputs missing: {missing}, unknown: {extra}; the model takes "
                            f"{[i.name for i in self.inputs]}")
        feeds = []
        for name, dtype, shape in self._in_specs:
            arr = np.asarray(named[name])
            if arr.dtype != dtype:
                raise LoadError(f"input {name!r} must be {dtype}, got {arr.dtype}")
            if arr.shape != shape:
                raise LoadError(f"input {name!r} must have shape {list(shape)}, got {list(arr.shape)}")
            feeds.append(np.ascontiguousarray(arr))
        return feeds

    def run(self, *args: np.ndarray, **named: np.ndarray) -> dict[str, np.ndarray]:
        """Outputs by name, for inputs given by position (manifest order) or by name."""
        feeds = self._feeds(args, named)
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self._out_specs]
        self._call(feeds, outs)
        return {name: a for (name, _, _), a in zip(self._out_specs, outs, strict=True)}

    def __call__(self, *args: np.ndarray, **named: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
        """The output (or a tuple of outputs, in manifest order)."""
        result = tuple(self.run(*args, **named).values())
        return result[0] if len(result) == 1 else result

    def _call(self, feeds: list[np.ndarray], outs: list[np.ndarray]) -> None:
        ins = self._in_array(*[_address(a) for a in feeds])
        res = self._out_array(*[_address(a) for a in outs])
        self._run(ins, res, *self._fixed)

    def profile(self, number: int, *args: np.ndarray, warmup: int = 3,
                **named: np.ndarray) -> list[tuple[OpInfo, float]]:
        """Median seconds of each kernel call over `number` runs, in graph order (aliases cost nothing)."""
        fn = getattr(self._lib, PROFILE, None)
        if fn is None:
            raise LoadError(f"{self.path} has no {PROFILE}: it was built by an older tunaflow; rebuild it")
        vpp = ctypes.POINTER(ctypes.c_void_p)
        fn.argtypes = [vpp, vpp, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = None
        ops = [op for op in self.manifest.ops if op.kind != "alias"]
        feeds = self._feeds(args, named)
        outs = [np.empty(o.shape, dtype=o.dtype) for o in self.outputs]
        ins = (ctypes.c_void_p * max(1, len(feeds)))(*[a.ctypes.data for a in feeds])
        res = (ctypes.c_void_p * max(1, len(outs)))(*[a.ctypes.data for a in outs])
        seconds = np.zeros((warmup + number, max(1, len(ops))), dtype=np.float64)
        for row in seconds:
            fn(ins, res, self._weights.ctypes.data, self._work.ctypes.data, row.ctypes.data)
        medians = np.median(seconds[warmup:], axis=0)
        return list(zip(ops, (float(m) for m in medians), strict=False))

    def bench(self, number: int, *args: np.ndarray, warmup: int = 3, **named: np.ndarray) -> list[float]:
        """Seconds of each of `number` calls (after `warmup` untimed ones)."""
        feeds = self._feeds(args, named)
        outs = [np.empty(o.shape, dtype=o.dtype) for o in self.outputs]
        for _ in range(warmup):
            self._call(feeds, outs)
        times = []
        for _ in range(number):
            t0 = time.perf_counter()
            self._call(feeds, outs)
            times.append(time.perf_counter() - t0)
        return times


def _address(a: np.ndarray) -> int:
    """The array's data address; through the buffer protocol when it is writable (3x quicker here
    than `__array_interface__`, a fair share of a small model's call)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(a))
    except (TypeError, ValueError):  # read-only or empty
        return a.__array_interface__["data"][0]


def _aligned_empty(nbytes: int) -> np.ndarray:
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    start = -raw.ctypes.data % ALIGN
    return raw[start:start + nbytes]


def load(out: str | Path, check_cpu: bool = True) -> Model:
    """Verify the artifact in `out` and load it into this process."""
    out = Path(out)
    manifest = read_manifest(out)
    verify(out, manifest)
    if check_cpu:
        import llvmlite.binding as llvm

        host_arch = llvm.get_default_triple().split("-")[0]
        if manifest.target.triple.split("-")[0] != host_arch:
            raise LoadError(f"{out} was built for {manifest.target.triple}, this machine is {host_arch}")
        lacking = missing_features(manifest.target.features, host_features())
        if lacking:
            raise LoadError(f"{out} was built for CPU {manifest.target.cpu} and needs features this CPU lacks: "
                            f"{', '.join(lacking[:12])}{' ...' if len(lacking) > 12 else ''}; rebuild it here "
                            "(tunaflow build --target host)")
    return Model(out, manifest)


def latency_stats(times: list[float]) -> dict[str, float]:
    """Median and p90 of per-call seconds, in milliseconds."""
    arr = np.sort(np.asarray(times))
    return {"median_ms": float(np.median(arr) * 1e3),
            "p90_ms": float(arr[min(len(arr) - 1, math.ceil(0.9 * len(arr)) - 1)] * 1e3),
            "calls": len(arr)}

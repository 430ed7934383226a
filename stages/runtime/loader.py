"""`load(OUT)` → a `Model` callable on numpy arrays.

The manifest is checked, never trusted. In order, before anything of the library runs:
1. with a key (`key=`, else TUNAFLOW_ARTIFACT_KEY), `manifest.sig` must be the HMAC of the manifest's bytes;
2. the manifest's format version must be this tunaflow's;
3. model.so and weights.bin must both be listed and match their sha256 (no manifest field turns this off);
4. the facts model.so embeds about itself (read from the file's ELF section, `stages/build/facts.py`) must
   agree with the manifest, the library may depend on nothing but system libraries, and the CPU must
   have the features it was compiled for.
Only then is the library opened: from a private in-memory copy of the very bytes that were checked (a file
swapped in after the check is never loaded), and its exported facts compared with the section's once more.
Calling refuses buffers of the wrong shape or dtype (sized by the library's facts) instead of reading past them,
and integer inputs that index a table (token ids) with a value outside it; a run the library itself stops (an
index computed out of range) is a RunError naming the node.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import hmac
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError

from schemas.manifest import (
    FORMAT_VERSION,
    KEY_ENV,
    LIBRARY,
    MANIFEST,
    PROFILE,
    SIGNATURE,
    WEIGHTS,
    Manifest,
    OpInfo,
    TensorInfo,
    artifact_key,
    signature,
)
from stages.build import facts as library_facts
from stages.build.facts import Facts
from stages.build.memplan import ALIGN
from stages.runtime.elf import Elf, ElfError

# What a model library may make the dynamic loader open besides itself: the C library and its parts.
SYSTEM_LIBRARY = re.compile(r"(libc|libm|libpthread|libdl|librt|libgcc_s)\.so(\.\d+)*|ld-linux[\w.-]*\.so(\.\d+)*")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# memfds of loaded libraries, never closed: ctypes never unloads a library, and a closed descriptor's
# number (its /proc/self/fd path) reused for the next library would make dlopen return the old one.
_IMAGES: list[int] = []


class LoadError(Exception):
    """The artifact cannot be loaded (or called) safely; the message names the reason."""


class RunError(LoadError):
    """The library stopped a run on bad data (an index out of range); the message names the node."""


def host_features() -> set[str]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    return {f for f in llvm.get_host_cpu_features().flatten().split(",") if f.startswith("+")}


def missing_features(required: str, host: set[str]) -> list[str]:
    return sorted(f[1:] for f in required.split(",") if f.startswith("+") and f not in host)


def read_manifest(out: Path, key: str | bytes | None = None) -> Manifest:
    """The manifest in `out`, its signature checked first when there is a key, its format version next."""
    path = Path(out) / MANIFEST
    if not path.is_file():
        raise LoadError(f"{out}: no {MANIFEST}; not a directory written by `tunaflow build`")
    raw = path.read_bytes()
    secret = artifact_key(key)
    if secret is not None:
        _check_signature(Path(out), raw, secret)
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise LoadError(f"{path}: not valid JSON ({exc})") from None
    version = data.get("format_version") if isinstance(data, dict) else None
    if type(version) is not int:
        raise LoadError(f"{path}: no integer format_version; not a manifest written by `tunaflow build`")
    if version < FORMAT_VERSION:
        raise LoadError(f"{out} has artifact format {version}, written by an older tunaflow; this one loads format "
                        f"{FORMAT_VERSION} only: rebuild it (tunaflow build)")
    if version > FORMAT_VERSION:
        raise LoadError(f"{out} has artifact format {version}, newer than this tunaflow's ({FORMAT_VERSION}): "
                        "load it with the tunaflow that built it, or rebuild it with this one")
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise LoadError(f"{path}: not a valid manifest ({'.'.join(map(str, err['loc']))}: {err['msg']})") from None


def _check_signature(out: Path, raw: bytes, key: bytes) -> None:
    sig = out / SIGNATURE
    if not sig.is_file():
        raise LoadError(f"{sig} is missing and a key is required ({KEY_ENV} is set): only artifacts built with "
                        "the key load; rebuild it with the key set")
    if not hmac.compare_digest(sig.read_bytes().strip(), signature(raw, key).encode()):
        raise LoadError(f"{sig} does not match {MANIFEST} under the required key ({KEY_ENV}): the manifest was "
                        "changed, or signed with another key, or by a build without the key; rebuild it")


def _digests(out: Path, manifest: Manifest) -> dict[str, str]:
    listed = set(manifest.files)
    if listed != {LIBRARY, WEIGHTS}:
        missing, extra = sorted({LIBRARY, WEIGHTS} - listed), sorted(listed - {LIBRARY, WEIGHTS})
        raise LoadError(f"{out / MANIFEST}: files must list the sha256 of {LIBRARY} and {WEIGHTS}, and nothing else "
                        f"(missing: {missing or 'none'}, unknown: {extra or 'none'}); rebuild it")
    bad = sorted(name for name, digest in manifest.files.items() if not _SHA256.fullmatch(digest))
    if bad:
        raise LoadError(f"{out / MANIFEST}: the sha256 of {', '.join(bad)} is not 64 hex digits; rebuild it")
    return manifest.files


def _mismatch(path: Path, actual: str, digest: str) -> LoadError:
    return LoadError(f"{path} does not match the manifest (sha256 {actual[:12]}..., manifest says "
                     f"{digest[:12]}...): the artifact was modified or is incomplete; rebuild it")


def _read(path: Path) -> bytes:
    if not path.is_file():
        raise LoadError(f"{path} is missing")
    return path.read_bytes()


def _read_weights(path: Path) -> np.ndarray:
    """weights.bin straight into an aligned buffer (ResNet-50's 100 MB: 0.37 -> 0.04 s), read once."""
    if not path.is_file():
        raise LoadError(f"{path} is missing")
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        buf = _aligned_empty(size)
        if f.readinto(buf) != size:
            raise LoadError(f"{path} changed while it was read; load it again")
    return buf


@dataclass(frozen=True)
class Verified:
    """An artifact's checked parts: the bytes checked are the bytes used."""

    out: Path
    manifest: Manifest
    facts: Facts
    image: bytes  # model.so
    weights: np.ndarray


def verify(out: Path, manifest: Manifest) -> Verified:
    """Digests, then the library's embedded facts against the manifest; nothing of the library runs."""
    out = Path(out)
    digests = _digests(out, manifest)
    image = _read(out / LIBRARY)
    actual = hashlib.sha256(image).hexdigest()
    if actual != digests[LIBRARY]:
        raise _mismatch(out / LIBRARY, actual, digests[LIBRARY])
    weights = _read_weights(out / WEIGHTS)
    actual = hashlib.sha256(weights).hexdigest()
    if actual != digests[WEIGHTS]:
        raise _mismatch(out / WEIGHTS, actual, digests[WEIGHTS])
    facts = embedded_facts(out / LIBRARY, image)
    wrong = library_facts.disagreements(facts, manifest)
    if wrong:
        raise LoadError(f"{out / MANIFEST} disagrees with the facts {LIBRARY} embeds on {'; '.join(wrong)}: the "
                        "manifest was edited or belongs to another library; nothing was run; rebuild it")
    if weights.nbytes != facts.weights_bytes:  # implied by the digests; stated for the buffer it sizes
        raise LoadError(f"{out / WEIGHTS} has {weights.nbytes} bytes, {LIBRARY} reads {facts.weights_bytes}; "
                        "rebuild it")
    return Verified(out, manifest, facts, image, weights)


def embedded_facts(path: Path, image: bytes) -> Facts:
    """The facts section of a library image, and a check that it opens no library but system ones."""
    try:
        elf = Elf(image)
        section = elf.section(library_facts.SECTION)
        deps = elf.dynamic()
    except ElfError as exc:
        raise LoadError(f"{path} is not a shared library tunaflow can check ({exc}); rebuild it") from None
    if section is None:
        raise LoadError(f"{path} embeds no facts ({library_facts.SECTION}): it was not built by this tunaflow; "
                        "rebuild it")
    try:
        found = library_facts.decode(section)
    except ValueError as exc:
        raise LoadError(f"{path}: its embedded facts are not valid ({exc}); rebuild it") from None
    foreign = [n for n in deps.needed if not SYSTEM_LIBRARY.fullmatch(n)]
    if foreign or deps.search_paths:
        raise LoadError(f"{path} would make the dynamic loader open more than system libraries (needs "
                        f"{foreign or 'only system ones'}, search path {list(deps.search_paths) or 'none'}): "
                        "a model library loads nothing else; rebuild it")
    return found


def _dlopen(image: bytes, path: Path) -> ctypes.CDLL:
    """dlopen a private, sealed in-memory copy of `image`: the file may change after it was checked."""
    try:
        fd = os.memfd_create(f"tunaflow:{path}", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError as exc:
        raise LoadError(f"{path}: no in-memory file to load it from ({exc.strerror})") from None
    try:
        view = memoryview(image)
        while view:
            view = view[os.write(fd, view):]
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
                    | fcntl.F_SEAL_SEAL)
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
    except OSError as exc:
        os.close(fd)
        raise LoadError(f"{path} could not be loaded ({exc}); rebuild it") from None
    _IMAGES.append(fd)
    return lib


class Model:
    """A loaded library. Not re-entrant: one call at a time per Model (it owns one workspace)."""

    def __init__(self, artifact: Verified):
        self.path, self.manifest, self.facts = artifact.out, artifact.manifest, artifact.facts
        self._lib = _dlopen(artifact.image, self.path / LIBRARY)
        section = self.facts.encode()
        try:
            exported = (ctypes.c_char * (len(section) + 1)).in_dll(self._lib, library_facts.SYMBOL).raw
        except ValueError:
            exported = b""
        if exported != section + b"\0":
            raise LoadError(f"{self.path / LIBRARY} exports facts ({library_facts.SYMBOL}) other than its "
                            f"{library_facts.SECTION} section says; rebuild it")
        vpp = ctypes.POINTER(ctypes.c_void_p)
        self._run = getattr(self._lib, "tf_run", None)
        if self._run is None:
            raise LoadError(f"{self.path / LIBRARY} has no tf_run: not a model library; rebuild it")
        self._run.argtypes = [vpp, vpp, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._run.restype = ctypes.c_int64
        self._status = np.zeros(3, dtype=np.int64)  # what the library writes when it stops a run
        self._weights = artifact.weights
        try:
            self._work = _aligned_empty(self.facts.workspace_bytes)
        except (MemoryError, ValueError):
            raise LoadError(f"{self.path} needs a {self.facts.workspace_bytes}-byte workspace, more memory than "
                            "there is") from None
        # Addresses and pointer-array types fixed once: a call then costs a few microseconds of Python.
        self._fixed = (self._weights.ctypes.data, self._work.ctypes.data, self._status.ctypes.data)
        self._in_array = ctypes.c_void_p * max(1, len(self.facts.inputs))
        self._out_array = ctypes.c_void_p * max(1, len(self.facts.outputs))
        # Buffers are sized by the library's own word, not the manifest's.
        self._in_specs = [(i.name, np.dtype(i.dtype), tuple(i.shape)) for i in self.facts.inputs]
        self._bounds = {i.name: i.bound for i in self.facts.inputs if i.bound is not None}
        self._out_specs = [(o.name, np.dtype(o.dtype), tuple(o.shape)) for o in self.facts.outputs]

    @property
    def inputs(self) -> tuple[TensorInfo, ...]:
        return self.facts.inputs

    @property
    def outputs(self) -> tuple[TensorInfo, ...]:
        return self.facts.outputs

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
            if name in self._bounds:
                _check_indices(name, arr, self._bounds[name])
            feeds.append(np.ascontiguousarray(arr))
        return feeds

    def use_workspace(self, buffer: np.ndarray) -> None:
        """Run in `buffer` (bytes, ALIGN-aligned, at least the library's workspace) instead of the workspace it
        allocated, so that two builds can be timed at the same addresses: where the workspace lies changed one
        of EfficientNet-B0's convs 2x and whole models 6-10% (Zen 5, benchmarks/RESULTS.md `zoo`)."""
        if (buffer.dtype != np.uint8 or buffer.ndim != 1 or not buffer.flags.c_contiguous or not buffer.flags.writeable
                or buffer.nbytes < self.facts.workspace_bytes or buffer.ctypes.data % ALIGN):
            raise LoadError(f"a workspace for {self.path} must be a writable 1-d uint8 array of at least "
                            f"{self.facts.workspace_bytes} bytes aligned to {ALIGN}")
        self._work = buffer
        self._fixed = (self._fixed[0], buffer.ctypes.data, self._fixed[2])

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
        self._stopped(self._run(ins, res, *self._fixed))

    def _stopped(self, code: int) -> None:
        """RunError for a run the library stopped at call `code` - 1 (0: it ran to the end)."""
        if code == 0:
            return
        ops = [op for op in self.manifest.ops if op.kind != "alias"]
        op = ops[code - 1] if 0 < code <= len(ops) else None
        where = f"{op.op} {op.node!r}" if op is not None else f"kernel call {code - 1}"
        value, extent = (int(v) for v in self._status[1:])
        raise RunError(f"the run stopped at {where}: index {value} is out of range for an axis of {extent} "
                       f"(valid: {-extent}..{extent - 1}); no output was returned")

    def profile(self, number: int, *args: np.ndarray, warmup: int = 3,
                **named: np.ndarray) -> list[tuple[OpInfo, float]]:
        """Median seconds of each kernel call over `number` runs, in graph order (aliases cost nothing)."""
        ops, seconds = self.profile_samples(number, *args, warmup=warmup, **named)
        return list(zip(ops, (float(m) for m in np.median(seconds, axis=0)), strict=False))

    def profile_samples(self, number: int, *args: np.ndarray, warmup: int = 3,
                        **named: np.ndarray) -> tuple[list[OpInfo], np.ndarray]:
        """The kernel calls in graph order and their seconds, one row per timed run (`number` x calls): the
        rows keep the order they ran in, so a caller can take medians per round of consecutive runs."""
        fn = getattr(self._lib, PROFILE, None)
        if fn is None:
            raise LoadError(f"{self.path} has no {PROFILE}: it was built by an older tunaflow; rebuild it")
        vpp = ctypes.POINTER(ctypes.c_void_p)
        fn.argtypes = [vpp, vpp, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        fn.restype = ctypes.c_int64
        ops = [op for op in self.manifest.ops if op.kind != "alias"]
        feeds = self._feeds(args, named)
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self._out_specs]
        ins = self._in_array(*[a.ctypes.data for a in feeds])
        res = self._out_array(*[a.ctypes.data for a in outs])
        seconds = np.zeros((warmup + number, max(1, self.facts.calls)), dtype=np.float64)  # one per call it times
        for row in seconds:
            self._stopped(fn(ins, res, self._weights.ctypes.data, self._work.ctypes.data, row.ctypes.data,
                             self._status.ctypes.data))
        n = min(len(ops), seconds.shape[1])
        return ops[:n], seconds[warmup:, :n]

    def bench(self, number: int, *args: np.ndarray, warmup: int = 3, **named: np.ndarray) -> list[float]:
        """Seconds of each of `number` calls (after `warmup` untimed ones)."""
        feeds = self._feeds(args, named)
        outs = [np.empty(shape, dtype=dtype) for _, dtype, shape in self._out_specs]
        for _ in range(warmup):
            self._call(feeds, outs)
        times = []
        for _ in range(number):
            t0 = time.perf_counter()
            self._call(feeds, outs)
            times.append(time.perf_counter() - t0)
        return times


def _check_indices(name: str, arr: np.ndarray, bound: int) -> None:
    """An input that indexes a table of `bound` entries must hold values in [-bound, bound) (ONNX's rule)."""
    if arr.size and (int(arr.min()) < -bound or int(arr.max()) >= bound):
        bad = np.argwhere((arr < -bound) | (arr >= bound))[0]
        raise LoadError(f"input {name!r} holds {int(arr[tuple(bad)])} at {list(map(int, bad))}, out of range for the "
                        f"table of {bound} entries it indexes (valid: {-bound}..{bound - 1})")


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


def load(out: str | Path, check_cpu: bool = True, key: str | bytes | None = None) -> Model:
    """Verify the artifact in `out` and load it into this process. With a key (`key`, else
    TUNAFLOW_ARTIFACT_KEY) only an artifact whose manifest.sig it made is even read further."""
    out = Path(out)
    artifact = verify(out, read_manifest(out, key))
    if check_cpu:
        import llvmlite.binding as llvm

        host_arch = llvm.get_default_triple().split("-")[0]
        if artifact.facts.triple.split("-")[0] != host_arch:
            raise LoadError(f"{out} was built for {artifact.facts.triple}, this machine is {host_arch}")
        lacking = missing_features(artifact.facts.features, host_features())
        if lacking:
            raise LoadError(f"{out} was built for CPU {artifact.facts.cpu} and needs features this CPU lacks: "
                            f"{', '.join(lacking[:12])}{' ...' if len(lacking) > 12 else ''}; rebuild it here "
                            "(tunaflow build --target host)")
    return Model(artifact)


def latency_stats(times: list[float]) -> dict[str, float]:
    """Median and p90 of per-call seconds, in milliseconds."""
    arr = np.sort(np.asarray(times))
    return {"median_ms": float(np.median(arr) * 1e3),
            "p90_ms": float(arr[min(len(arr) - 1, math.ceil(0.9 * len(arr)) - 1)] * 1e3),
            "calls": len(arr)}

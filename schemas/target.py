"""The hardware a kernel is compiled and tuned for.

Logs are matched on `Target.key`, so the key depends only on what changes generated code:
triple, CPU name and feature set (not on the display name).
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator

# CPUs whose widest usable vector unit is 512 bits (LLVM names).
_AVX512_CPUS = {
    "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client", "icelake-server",
    "tigerlake", "sapphirerapids", "emeraldrapids", "graniterapids", "znver4", "znver5", "x86-64-v4",
}
_AVX2_CPUS = {
    "haswell", "broadwell", "skylake", "alderlake", "raptorlake", "meteorlake", "znver1", "znver2",
    "znver3", "x86-64-v3",
}


# What LLVM's triples, CPU names and feature lists are made of: anything else is a typo or an attack on
# whatever prints it (a CPU named `[/]` once tuned with every trial a build timeout).
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*")
_FEATURES = re.compile(r"([+-][A-Za-z0-9_.-]+(,[+-][A-Za-z0-9_.-]+)*)?")


class TargetError(ValueError):
    """A target string or preset that cannot be understood."""


class Target(BaseModel):
    """A compilation target with the facts schedules need (vector width, cache sizes, cores)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    triple: str = Field(min_length=3)
    cpu: str = Field(min_length=1)
    features: str = ""
    cores: int = Field(ge=1, le=1024)
    vector_bits: int
    l1_bytes: int = Field(gt=0)
    l2_bytes: int = Field(gt=0)
    l3_bytes: int = Field(gt=0)

    @field_validator("vector_bits")
    @classmethod
    def _vector_bits(cls, v: int) -> int:
        if v not in (128, 256, 512):
            raise ValueError(f"vector_bits must be 128, 256 or 512, got {v}")
        return v

    @field_validator("features")
    @classmethod
    def _canonical_features(cls, v: str) -> str:
        items = sorted({f.strip() for f in v.split(",") if f.strip()})
        bad = [f for f in items if f[0] not in "+-"]
        if bad:
            raise ValueError(f"each feature must start with + or -, got {bad}")
        return ",".join(items)

    @property
    def key(self) -> str:
        digest = hashlib.sha256(self.features.encode()).hexdigest()[:8]
        return f"{self.triple}:{self.cpu}:{digest}"

    @property
    def vector_lanes(self) -> int:
        """float32 lanes in one vector register."""
        return self.vector_bits // 32

    @property
    def double_pumped(self) -> bool:
        """Whether 512-bit ops run as two 256-bit halves (Zen 4): there half-width vectors issue as many
        FLOPs per cycle as full ones, where Zen 5 and Intel's AVX-512 cores run them at half the rate."""
        return self.vector_bits == 512 and self.cpu == "znver4"

    @property
    def vector_registers(self) -> int:
        if self.vector_bits == 512 or self.triple.startswith("aarch64"):
            return 32
        return 16

    def to_string(self) -> str:
        """The TVM-like string this target parses back from."""
        parts = ["llvm", f"-mtriple={self.triple}", f"-mcpu={self.cpu}", f"-num-cores={self.cores}"]
        if self.features:
            parts.append(f"-mattr={self.features}")
        return " ".join(parts)

    @classmethod
    def host(cls) -> Target:
        """Detect this machine through LLVM and sysfs."""
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        features = llvm.get_host_cpu_features().flatten()
        cpu = llvm.get_host_cpu_name()
        caches = _sysfs_caches()
        return cls(
            name="host",
            triple=llvm.get_default_triple(),
            cpu=cpu,
            features=features,
            cores=len(os.sched_getaffinity(0)),
            vector_bits=_vector_bits(cpu, features, llvm.get_default_triple()),
            l1_bytes=caches.get(1, 32 * 1024),
            l2_bytes=caches.get(2, 1024 * 1024),
            l3_bytes=caches.get(3, 8 * 1024 * 1024),
        )

    @classmethod
    def parse(cls, text: str) -> Target:
        """A preset name (`host`, `x86-64-avx2`, ...) or a TVM-like `llvm -mtriple=... -mcpu=...`."""
        text = text.strip()
        if text in PRESETS or text == "host":
            return preset(text)
        words = shlex.split(text)
        if not words or words[0] != "llvm":
            raise TargetError(
                f"unknown target {text!r}: give a preset ({', '.join(['host', *PRESETS])}) "
                "or a string starting with 'llvm', e.g. 'llvm -mtriple=x86_64-linux-gnu -mcpu=haswell'"
            )
        opts: dict[str, str] = {}
        for word in words[1:]:
            if not word.startswith("-") or "=" not in word:
                raise TargetError(f"target option {word!r} is not of the form -name=value")
            k, v = word[1:].split("=", 1)
            opts[k] = v
        known = {"mtriple", "mcpu", "mattr", "num-cores", "name", "vector-bits"}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise TargetError(f"unknown target option(s) {unknown}; known: {sorted(known)}")
        if "mtriple" not in opts or "mcpu" not in opts:
            host = cls.host()
            opts.setdefault("mtriple", host.triple)
            opts.setdefault("mcpu", host.cpu)
            if "mattr" not in opts and opts["mcpu"] == host.cpu:
                opts["mattr"] = host.features
        for field, value in (("mtriple", opts["mtriple"]), ("mcpu", opts["mcpu"])):
            if not _WORD.fullmatch(value):
                raise TargetError(f"target option -{field}={value!r} is not a valid LLVM name (letters, digits, "
                                  "'_', '.', '+', '-')")
        if not _FEATURES.fullmatch(opts.get("mattr", "")):
            raise TargetError(f"target option -mattr={opts['mattr']!r} is not a comma list of +feature/-feature")
        try:
            cores = int(opts.get("num-cores", "1"))
            features = opts.get("mattr", "")
            vbits = int(opts.get("vector-bits") or _vector_bits(opts["mcpu"], features, opts["mtriple"]))
        except ValueError as exc:
            raise TargetError(f"bad number in target {text!r}: {exc}") from exc
        return cls(
            name=opts.get("name", opts["mcpu"]),
            triple=opts["mtriple"],
            cpu=opts["mcpu"],
            features=features,
            cores=cores,
            vector_bits=vbits,
            l1_bytes=32 * 1024,
            l2_bytes=1024 * 1024,
            l3_bytes=16 * 1024 * 1024,
        )


def _vector_bits(cpu: str, features: str, triple: str) -> int:
    feats = set(features.split(","))
    if triple.startswith(("aarch64", "arm")):
        return 128
    if "+avx512f" in feats or (cpu in _AVX512_CPUS and "-avx512f" not in feats):
        return 512
    if "+avx2" in feats or "+avx" in feats or cpu in _AVX2_CPUS:
        return 256
    return 128


def _sysfs_caches() -> dict[int, int]:
    """Data/unified cache sizes per level for cpu0, in bytes."""
    sizes: dict[int, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        mult = {"K": 1024, "M": 1024 * 1024}.get(size[-1], 1)
        sizes[level] = int(size.rstrip("KM")) * mult
    return sizes


PRESETS: dict[str, dict] = {
    "x86-64-avx2": dict(
        name="x86-64-avx2", triple="x86_64-unknown-linux-gnu", cpu="haswell",
        features="+avx,+avx2,+fma,+sse4.2,-avx512f", cores=4, vector_bits=256,
        l1_bytes=32 * 1024, l2_bytes=256 * 1024, l3_bytes=8 * 1024 * 1024,
    ),
    "x86-64-avx512": dict(
        name="x86-64-avx512", triple="x86_64-unknown-linux-gnu", cpu="skylake-avx512",
        features="+avx,+avx2,+fma,+avx512f", cores=2, vector_bits=512,
        l1_bytes=32 * 1024, l2_bytes=1024 * 1024, l3_bytes=32 * 1024 * 1024,
    ),
    "aarch64": dict(
        name="aarch64", triple="aarch64-unknown-linux-gnu", cpu="cortex-a72",
        features="+neon", cores=4, vector_bits=128,
        l1_bytes=32 * 1024, l2_bytes=1024 * 1024, l3_bytes=1024 * 1024,
    ),
}


def preset(name: str) -> Target:
    if name == "host":
        return Target.host()
    if name not in PRESETS:
        raise TargetError(f"unknown target preset {name!r}; presets: {', '.join(['host', *PRESETS])}")
    return Target(**PRESETS[name])

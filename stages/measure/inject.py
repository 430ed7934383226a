"""Make chosen candidates misbehave for real: segfault, hang, write NaN or wrong values, or allocate
without bound. The template's `tf_main` is renamed and wrapped by one that runs it and then
commits the fault, so the fault is in the compiled object the runner loads, like a bad schedule.

Which candidates are faulty is a pure function of (config index, seed), so a benchmark can
check that every fault was recorded with the right error code.
"""

from __future__ import annotations

import hashlib

from schemas.measure import MeasureErrorNo

KINDS = ("segfault", "hang", "nan", "wrong", "alloc")

EXPECTED: dict[str, MeasureErrorNo] = {
    "segfault": MeasureErrorNo.runtime_error,
    "hang": MeasureErrorNo.run_timeout,
    "nan": MeasureErrorNo.wrong_answer,
    "wrong": MeasureErrorNo.wrong_answer,
    "alloc": MeasureErrorNo.runtime_error,
}

_DEFINE = 'define void @"tf_main"('


def fault_for(index: int, rate: float, seed: int, kinds: tuple[str, ...] = KINDS) -> str | None:
    """The fault injected into config `index`, or None; deterministic in (index, seed)."""
    if rate <= 0:
        return None
    h = int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "little")
    if (h % 1_000_000) / 1_000_000 >= rate:
        return None
    return kinds[(h >> 32) % len(kinds)]


def inject(ir_text: str, kind: str, output_arg: int) -> str:
    """IR whose `tf_main` runs the real kernel, then commits `kind`. `output_arg` indexes the
    output buffer in the argument array (templates put it last)."""
    if kind not in KINDS:
        raise ValueError(f"unknown fault {kind!r}; faults: {', '.join(KINDS)}")
    if _DEFINE not in ir_text:
        raise ValueError("IR has no tf_main definition to wrap")
    renamed = ir_text.replace(_DEFINE, 'define internal void @"tf_main.real"(', 1)
    return renamed + _WRAPPER.format(body=_BODIES[kind].format(out=output_arg))


_WRAPPER = """
declare i8* @malloc(i64)
declare void @abort()
declare i8* @memset(i8*, i32, i64)

define void @"tf_main"(i8* %args) {{
entry:
  call void @"tf_main.real"(i8* %args)
  %argv = bitcast i8* %args to float**
{body}
}}
"""

_BODIES = {
    "segfault": """  store volatile float 1.0, float* null
  ret void""",
    "hang": """  %sink = alloca float
  br label %spin
spin:
  store volatile float 0.0, float* %sink
  br label %spin""",
    "nan": """  %p = getelementptr float*, float** %argv, i64 {out}
  %o = load float*, float** %p
  store float 0x7FF8000000000000, float* %o
  ret void""",
    "wrong": """  %p = getelementptr float*, float** %argv, i64 {out}
  %o = load float*, float** %p
  %v = load float, float* %o
  %w = fadd float %v, 1.0e3
  store float %w, float* %o
  ret void""",
    "alloc": """  %keep = alloca i8*
  br label %grow
grow:
  %m = call i8* @malloc(i64 268435456)
  %null = icmp eq i8* %m, null
  br i1 %null, label %fail, label %touch
touch:
  call i8* @memset(i8* %m, i32 1, i64 268435456)
  store volatile i8* %m, i8** %keep
  br label %grow
fail:
  call void @abort()
  unreachable""",
}

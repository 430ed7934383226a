"""Faulty kernels as real LLVM objects (exporting tf_main and tf_bench) and what the local runner records.

The helpers here are shared with the RPC tests: each kernel is compiled by LLVM for the host and
loaded by the same worker as a tuned candidate.
"""

from __future__ import annotations

from llvmlite import ir

from schemas import MeasureErrorNo, MeasureOptions, Target, matmul_task
from schemas.task import TuningTask
from stages.codegen.compile import compile_ir
from stages.codegen.harness import add_harness
from stages.codegen.irb import F32, F32P, I64, VOIDP
from stages.measure.artifact import BuildResult
from stages.measure.builder import build_one
from stages.measure.runner import LocalRunner
from stages.templates import matmul

TASK = matmul_task(32, 48, 40)
FAST = MeasureOptions(number=1, repeat=3, min_repeat_ms=1, timeout=2.0)
FAULTS = ("segfault", "sigill", "hang", "wrong")


def faulty_object(kind: str, target: Target) -> bytes:
    """`tf_main` that writes through a kernel-space pointer, traps, spins forever, or leaves C untouched."""
    mod = ir.Module(name=kind)
    mod.triple = target.triple
    main = ir.Function(mod, ir.FunctionType(ir.VoidType(), [VOIDP]), name="tf_main")
    b = ir.IRBuilder(main.append_basic_block("entry"))
    if kind == "segfault":
        addr = b.or_(b.ptrtoint(main.args[0], I64), ir.Constant(I64, 1 << 63))
        b.store(ir.Constant(F32, 1.0), b.inttoptr(addr, F32P))
    elif kind == "sigill":
        b.call(ir.Function(mod, ir.FunctionType(ir.VoidType(), []), name="llvm.trap"), [])
    elif kind == "hang":
        c = b.load(b.gep(b.bitcast(main.args[0], F32P.as_pointer()), [ir.Constant(I64, 2)]))
        loop = main.append_basic_block("spin")
        b.branch(loop)
        b = ir.IRBuilder(loop)
        b.store(b.fadd(b.load(c), ir.Constant(F32, 1.0)), c)
        b.branch(loop)
        add_harness(mod, main)
        return compile_ir(mod, target).data
    elif kind != "wrong":
        raise ValueError(kind)
    b.ret_void()
    add_harness(mod, main)
    return compile_ir(mod, target).data


def build_of(kind: str, target: Target, task: TuningTask = TASK) -> BuildResult:
    """A good candidate (`ok`, the template's default schedule) or one of FAULTS, ready for a runner."""
    config = matmul.default_config(task, target)
    if kind == "ok":
        return build_one(task, config, target)
    return BuildResult(task, target, config, faulty_object(kind, target), 0.01)


def test_each_fault_is_recorded_with_its_code_and_the_runner_goes_on(host):
    builds = [build_of(k, host) for k in ("ok", "segfault", "wrong", "sigill", "hang", "ok")]
    with LocalRunner(FAST) as runner:
        results = runner.run(builds)
        restarts = runner.restarts
    codes = [r.error_no for r in results]
    assert codes == [MeasureErrorNo.no_error, MeasureErrorNo.runtime_error, MeasureErrorNo.wrong_answer,
                     MeasureErrorNo.runtime_error, MeasureErrorNo.run_timeout, MeasureErrorNo.no_error]
    assert "SIGSEGV" in results[1].error_msg
    assert "max abs error" in results[2].error_msg
    assert "SIGILL" in results[3].error_msg
    assert "2.0 s" in results[4].error_msg
    assert results[0].ok and results[5].ok and len(results[5].costs) == 3
    assert restarts == 3  # after the segfault, the trap and the hang

"""Issue 25 end to end on the arm64 device under qemu (opt-in: `make arm64-test`, as root, after
`make arm64-device`): the device's agent registers an aarch64 target with the board's CPU, a matmul and
a conv2d are tuned over RPC for it (the host compiles, the device checks and times), kernels that crash
on the device (a segfault, a trap, an SVE instruction the emulated Cortex-A76 lacks) are recorded errors,
the bundled CNN built for aarch64 runs in the device and matches onnxruntime and the host's own build, and
prefect.yaml's arm64 deployment runs against the device end to end. Timings under emulation say nothing
about a board.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pytest
import yaml

from schemas.manifest import MANIFEST, Manifest
from schemas.measure import MeasureErrorNo
from schemas.options import MeasureOptions
from schemas.target import Target
from stages.rpc.client import RPCRunner
from testing.cli import ROOT, tunaflow
from testing.cluster import Cluster

ARM64_ROOT = Path(os.environ.get("ARM64_ROOT") or Path.home() / ".cache/tunaflow/arm64")
CPU = "cortex-a76"
KEY = "arm64"
CROSS_CC = "aarch64-linux-gnu-gcc"
DEPLOYMENT = "cnn-arm64-device"
needs_cross_cc = pytest.mark.skipif(shutil.which(CROSS_CC) is None,
                                    reason=f"no {CROSS_CC}: apt-get install gcc-aarch64-linux-gnu")


def _skip_reason() -> str | None:
    if os.environ.get("TUNAFLOW_ARM64") != "1":
        return "opt-in: run `make arm64-test` (root, after `make arm64-device`)"
    if os.geteuid() != 0:
        return "the arm64 device needs root (chroot and mounts)"
    if not (ARM64_ROOT / ".ready").exists():
        return f"no arm64 device at {ARM64_ROOT}: run `make arm64-device` first"
    return None


pytestmark = [pytest.mark.arm64, pytest.mark.skipif(_skip_reason() is not None, reason=_skip_reason() or "")]


def _mounts_under_device() -> list[str]:
    return [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(ARM64_ROOT) in line]


@pytest.fixture(scope="module")
def device(tmp_path_factory):
    """A tracker on the host and `make arm64-agent` under it; stopped with Ctrl-C (SIGINT) afterwards."""
    tmp = tmp_path_factory.mktemp("arm64")
    token = "arm64-device-test-token-0123456789"
    token_file = tmp / "token"
    token_file.write_text(token)
    with Cluster(tmp, token) as cluster:
        cluster.start_tracker()
        start = time.monotonic()
        with open(tmp / "agent.log", "w") as log:
            agent = subprocess.Popen(["make", "-s", "arm64-agent", f"TRACKER=127.0.0.1:{cluster.port}", f"KEY={KEY}",
                                      f"TOKEN_FILE={token_file}", f"ARM64_CPU={CPU}", f"ARM64_ROOT={ARM64_ROOT}"],
                                     cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            cluster.wait(lambda s: any(k.key == KEY and k.devices for k in s.keys), timeout=300)
            print(f"device registered {time.monotonic() - start:.1f} s after start")
            yield cluster, token_file, agent
        finally:
            os.killpg(agent.pid, signal.SIGINT)
            try:
                agent.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(agent.pid, signal.SIGKILL)
                agent.wait()
    assert _mounts_under_device() == [], "the agent left mounts behind"


def _tune(device, tmp_path: Path, *args: str) -> tuple[dict, Path]:
    cluster, token_file, _ = device
    log = tmp_path / "log"
    start = time.monotonic()
    res = tunaflow("tune-op", *args, "--trials", 16, "--batch-size", 8, "--log", log, "--runner", "rpc", "--key", KEY,
                   "--tracker", f"127.0.0.1:{cluster.port}", "--token-file", token_file, "--no-prefect", "--json",
                   timeout=900)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads(res.stdout)
    print(f"{report['task']}: {report['trials']} trials in {time.monotonic() - start:.1f} s")
    return report, log


def test_the_device_registers_aarch64_with_the_cpu_it_was_told(device):
    (entry,) = [k for k in device[0].status().keys if k.key == KEY]
    t = entry.target
    assert (t.triple, t.cpu, t.features) == ("aarch64-unknown-linux-gnu", CPU, "")
    assert (t.vector_bits, t.vector_lanes, t.vector_registers) == (128, 4, 32)
    assert (t.l1_bytes, t.l2_bytes, t.l3_bytes) == (64 * 1024, 512 * 1024, 2 * 1024 * 1024)  # make's ARM64_CACHES


@pytest.mark.parametrize("op", [("matmul", "--m", "64", "--n", "64", "--k", "64"),
                                ("conv2d", "--input", "1x16x16x16", "--weight", "16x16x3x3", "--pad", "1")],
                         ids=["matmul", "conv2d"])
def test_tuning_over_rpc_for_the_device(device, tmp_path, op):
    report, log = _tune(device, tmp_path, *op)
    assert report["trials"] >= 16 and report["errors"] == {}, report
    assert report["target_key"].startswith(f"aarch64-unknown-linux-gnu:{CPU}:")
    table = ds.dataset(log).to_table()
    assert set(table["target_key"].to_pylist()) == {report["target_key"]}  # keyed on the device, not the host
    errors = pc.struct_field(table["result"], "error_no").to_pylist()
    assert errors.count(int(MeasureErrorNo.no_error)) >= 16 and set(errors) == {int(MeasureErrorNo.no_error)}
    assert report["best_config"]["vw"] == 4  # NEON's 4 float32 lanes, never the host's 16


def test_kernels_that_crash_on_the_device_are_recorded_errors(device):
    """A segfault, a trap (brk) and an SVE instruction the board (a Cortex-A76, which qemu emulates) lacks in
    the shipped object kill a worker on the device, never the agent."""
    from stages.codegen.compile import assembly, compile_ir
    from stages.measure.artifact import BuildResult
    from stages.measure.inject import inject
    from stages.templates import template_for
    from stages.templates.matmul import task as matmul_task

    cluster, _, agent = device
    with RPCRunner(MeasureOptions(timeout=60), KEY, cluster.url, cluster.token, queue_timeout_s=300.0) as runner:
        target = runner.device_target()
        assert isinstance(target, Target) and target.cpu == CPU
        task = matmul_task(32, 32, 32)
        tpl = template_for(task)
        cfg = tpl.default_config(task, target)
        good = str(tpl.build_ir(task, cfg.knobs, target))
        trap = good.replace('define void @"tf_main"(', 'define void @"tf_main.real"(', 1) + (
            '\ndeclare void @llvm.trap()\n\ndefine void @"tf_main"(i8* %args) {\nentry:\n'
            '  call void @"tf_main.real"(i8* %args)\n  call void @llvm.trap()\n  ret void\n}\n')
        sve = good.replace('define void @"tf_main"(', 'define void @"tf_main.real"(', 1) + (
            '\ndeclare i64 @llvm.vscale.i64()\n\ndefine void @"tf_main"(i8* %args) {\nentry:\n'
            '  %slot = alloca i64\n  %vscale = call i64 @llvm.vscale.i64()\n  store volatile i64 %vscale, i64* %slot\n'
            '  call void @"tf_main.real"(i8* %args)\n  ret void\n}\n')
        with_sve = target.model_copy(update={"features": "+sve"})
        assert "rdvl" in assembly(sve, with_sve)  # SVE's read-vector-length: no Cortex-A76 has it
        builds = [BuildResult(task, target, cfg, compile_ir(text, target).data, 0.0)
                  for text in (good, inject(good, "segfault", len(task.inputs)), trap)]
        builds.append(BuildResult(task, with_sve, cfg, compile_ir(sve, with_sve).data, 0.0))
        results = runner.run(builds)
    assert [r.error_no for r in results] == [MeasureErrorNo.no_error, *[MeasureErrorNo.runtime_error] * 3], \
        [r.error_msg for r in results]
    assert "SIGSEGV" in results[1].error_msg and "SIGTRAP" in results[2].error_msg
    assert "SIGILL" in results[3].error_msg
    assert agent.poll() is None and any(k.key == KEY and k.devices for k in cluster.status().keys)


@needs_cross_cc
def test_the_cnn_built_for_aarch64_runs_on_the_device_and_matches(tmp_path):
    import onnxruntime as ort

    model = ROOT / "data/models/cnn.onnx"
    x = np.random.default_rng(25).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=x)
    expected = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    built = tunaflow("build", model, "-o", tmp_path / "lib", "--target", "aarch64", timeout=600)  # links with CROSS_CC
    assert built.returncode == 0, built.stderr[-2000:]
    assert tunaflow("build", model, "-o", tmp_path / "host-lib", timeout=600).returncode == 0
    assert tunaflow("run", tmp_path / "host-lib", "--inputs", tmp_path / "in.npz", "--output",
                    tmp_path / "host.npz").returncode == 0
    start = time.monotonic()
    ran = subprocess.run(["make", "-s", "arm64-run", f"LIB={tmp_path / 'lib'}", f"INPUTS={tmp_path / 'in.npz'}",
                          f"OUTPUT={tmp_path / 'out.npz'}", f"ARM64_ROOT={ARM64_ROOT}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    print(f"make arm64-run: {time.monotonic() - start:.1f} s")
    got = np.load(tmp_path / "out.npz")["logits"]
    host = np.load(tmp_path / "host.npz")["logits"]
    err = float(np.abs(got - expected).max() / np.abs(expected).max())
    print(f"aarch64 library vs onnxruntime: max error {err:.2e} of the max abs output; "
          f"vs the host build {float(np.abs(got - host).max()):.2e}")
    assert err < 1e-5 and np.allclose(got, host, rtol=1e-5, atol=1e-6)
    assert _mounts_under_device() == []


@needs_cross_cc
def test_the_arm64_deployment_tunes_the_cnn_on_the_device_and_its_library_runs_there(device, prefect_server,
                                                                                     tmp_path):
    """prefect.yaml's arm64 deployment as a user runs it: `prefect deploy --all`, a flow run of it, a process
    worker executing that run; its trials are measured on the device and keyed on the device's target, and
    the aarch64 library it builds runs in the device (`make arm64-run`) matching onnxruntime on the host."""
    import onnxruntime as ort
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL

    cluster, _, _ = device
    (registered,) = [k.target for k in cluster.status().keys if k.key == KEY]
    spec = {d["name"]: d for d in yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]}[DEPLOYMENT]
    assert spec["parameters"]["options"]["runner"]["key"] == KEY and spec["parameters"]["target"] == "host"
    prefect = [sys.executable, "-m", "prefect"]
    env = {**cluster.env, "PREFECT_API_URL": PREFECT_API_URL.value()}  # the worker holds the token
    subprocess.run([*prefect, "work-pool", "create", "tunaflow", "--type", "process"], env=env, cwd=ROOT,
                   capture_output=True, text=True, timeout=120)
    deployed = subprocess.run([*prefect, "--no-prompt", "deploy", "--all"], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    options = spec["parameters"]["options"]
    options = {**options, "batch_size": 4, "runner": {**options["runner"], "port": cluster.port}}
    log, lib = tmp_path / "log", tmp_path / "lib"
    start = time.monotonic()
    flow_run = run_deployment(f"tune-model/{DEPLOYMENT}", timeout=0, parameters={
        "budget": 20, "options": options, "log_path": str(log), "out": str(lib)})
    worker = subprocess.run([*prefect, "worker", "start", "--pool", "tunaflow", "--run-once"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=1800)

    async def state() -> str:
        async with get_client() as client:
            return (await client.read_flow_run(flow_run.id)).state.type.value

    assert asyncio.run(state()) == "COMPLETED", worker.stdout[-3000:] + worker.stderr[-3000:]
    print(f"{DEPLOYMENT}: deployment run by a worker in {time.monotonic() - start:.1f} s")
    table = ds.dataset(log).to_table()
    assert set(table["target_key"].to_pylist()) == {registered.key}  # measured on, and keyed on, the device
    errors = pc.struct_field(table["result"], "error_no").to_pylist()
    assert len(errors) >= 20 and set(errors) == {int(MeasureErrorNo.no_error)}
    manifest = Manifest.model_validate_json((lib / MANIFEST).read_text())
    assert manifest.target_key == registered.key and any(op.kind == "tuned" for op in manifest.ops)

    x = np.random.default_rng(5).standard_normal((1, 3, 64, 64)).astype(np.float32)
    np.savez(tmp_path / "in.npz", input=x)
    expected = ort.InferenceSession(str(ROOT / spec["parameters"]["model"]),
                                    providers=["CPUExecutionProvider"]).run(None, {"input": x})[0]
    ran = subprocess.run(["make", "-s", "arm64-run", f"LIB={lib}", f"INPUTS={tmp_path / 'in.npz'}",
                          f"OUTPUT={tmp_path / 'out.npz'}", f"ARM64_ROOT={ARM64_ROOT}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    err = float(np.abs(np.load(tmp_path / "out.npz")["logits"] - expected).max() / np.abs(expected).max())
    print(f"{DEPLOYMENT}'s library in the device vs onnxruntime: max error {err:.2e} of the max abs output")
    assert err < 1e-5

"""The target a device agent registers, and `runner serve --cpu/--caches` (issue 25): under emulation an arm64 userland
reads its CPU as `generic` with the emulator's features, so the agent is told the board's real CPU.

Fast and host-only: LLVM's CPU check runs for real; the aarch64 detection is the one fact a host cannot
produce, so those cases start from the target qemu's userland reads (triple, `generic`, its features).
"""

from __future__ import annotations

import pytest

from schemas.target import Target, TargetError
from stages.rpc import agent
from testing.cli import tunaflow
from testing.cluster import Cluster

# What Target.host() returns inside the arm64 rootfs under qemu-user (no /sys: default caches).
EMULATED = Target(name="host", triple="aarch64-unknown-linux-gnu", cpu="generic", features="+neon,+sve,+sve2,+fp-armv8",
                  cores=2, vector_bits=128, l1_bytes=32 * 1024, l2_bytes=1024 * 1024, l3_bytes=8 * 1024 * 1024)


@pytest.fixture
def emulated(monkeypatch):
    monkeypatch.setattr(Target, "host", classmethod(lambda cls: EMULATED))


def test_without_cpu_the_detected_target_registers():
    assert agent.device_target() == Target.host()


def test_cpu_names_the_board_and_drops_the_emulators_features(emulated):
    t = agent.device_target("cortex-a76")
    assert (t.triple, t.cpu, t.name, t.features) == ("aarch64-unknown-linux-gnu", "cortex-a76", "cortex-a76", "")
    assert (t.vector_bits, t.vector_lanes, t.vector_registers) == (128, 4, 32)  # NEON: 4 float32 lanes, v0-v31
    assert (t.cores, t.l1_bytes, t.l2_bytes, t.l3_bytes) == (2, 32 * 1024, 1024 * 1024, 8 * 1024 * 1024)
    assert t.key != EMULATED.key and t.key.startswith("aarch64-unknown-linux-gnu:cortex-a76:")


def test_caches_replace_the_defaults_an_emulator_falls_back_to(emulated):
    t = agent.device_target("cortex-a76", "64K,512K,2M")
    assert (t.cpu, t.l1_bytes, t.l2_bytes, t.l3_bytes) == ("cortex-a76", 64 * 1024, 512 * 1024, 2 * 1024 * 1024)
    assert agent.device_target(None, "48K,2M,32M").l2_bytes == 2 * 1024 * 1024
    for bad in ("64K,512K", "64K,512K,2G", "0,1M,2M", "x,y,z"):
        with pytest.raises(TargetError, match="are not three sizes L1,L2,L3"):
            agent.device_target("cortex-a76", bad)


def test_a_cpu_llvm_does_not_know_is_an_error(emulated):
    with pytest.raises(TargetError, match="'cortex-a7x' is not one LLVM knows for aarch64-unknown-linux-gnu"):
        agent.device_target("cortex-a7x")


def test_a_cpu_of_another_architecture_is_an_error_not_an_abort():
    """On x86-64 LLVM aborts the process for an ARM CPU name; the probe runs in a child, so this is an error."""
    host = Target.host()
    if not host.triple.startswith("x86_64"):
        pytest.skip(f"needs an x86-64 host, this is {host.triple}")
    with pytest.raises(TargetError, match="'cortex-a76' is not one LLVM knows for x86_64"):
        agent.device_target("cortex-a76")
    assert agent.device_target(host.cpu).cpu == host.cpu


def test_runner_serve_refuses_a_bad_cpu_in_one_line(tmp_path):
    bad = tunaflow("runner", "serve", "--key", "arm64", "--cpu", "not-a-cpu", timeout=120,
                   env={"TUNAFLOW_RPC_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert bad.returncode == 2, bad.stderr
    assert "error: CPU 'not-a-cpu' is not one LLVM knows" in bad.stderr and "Traceback" not in bad.stderr
    both = tunaflow("runner", "serve", "--key", "arm64", "--cpu", "cortex-a76", "--target", "aarch64", timeout=120,
                    env={"TUNAFLOW_RPC_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert both.returncode == 2 and "--cpu and --caches correct the detected target" in both.stderr
    caches = tunaflow("runner", "serve", "--key", "arm64", "--caches", "64K", timeout=120,
                      env={"TUNAFLOW_RPC_TOKEN": "t" * 32, "PATH": "/usr/bin:/bin"})
    assert caches.returncode == 2 and "error: caches '64K' are not three sizes" in caches.stderr


def test_the_tracker_records_the_cpu_the_agent_was_told(tmp_path):
    """An agent started with --cpu registers that CPU: the target `tune-op --runner rpc` then compiles for."""
    host = Target.host()
    told = "x86-64-v2" if host.triple.startswith("x86_64") else "cortex-a76"
    with Cluster(tmp_path, "s" * 32) as cluster:
        cluster.start_tracker()
        cluster.spawn("agent", "runner", "serve", "--tracker", f"127.0.0.1:{cluster.port}", "--key", "board",
                      "--cpu", told, "--caches", "64K,512K,2M")
        status = cluster.devices(1)
    (entry,) = status.keys
    assert entry.key == "board" and entry.target is not None
    assert (entry.target.cpu, entry.target.triple, entry.target.features) == (told, host.triple, "")
    assert (entry.target.l1_bytes, entry.target.l3_bytes) == (64 * 1024, 2 * 1024 * 1024)
    assert entry.target.key != host.key

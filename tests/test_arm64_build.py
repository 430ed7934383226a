"""`tunaflow build --target aarch64` on another machine links with Debian's cross compiler (issue 25), and says
which package to install when it is missing; the library is an aarch64 shared object."""

from __future__ import annotations

import shutil

import pytest

from stages.build.library import BuildError, find_compiler
from testing.cli import ROOT, tunaflow

CROSS = "aarch64-linux-gnu-gcc"
AARCH64 = "aarch64-unknown-linux-gnu"
needs_cross = pytest.mark.skipif(shutil.which(CROSS) is None,
                                 reason=f"no {CROSS}: apt-get install gcc-aarch64-linux-gnu")


@pytest.fixture
def x86_host(host):
    if not host.triple.startswith("x86_64"):
        pytest.skip(f"cross-linking for aarch64 is tested from an x86-64 host, this is {host.triple}")
    return host


@needs_cross
def test_an_aarch64_target_links_with_the_cross_compiler(x86_host):
    assert find_compiler(None, AARCH64) == shutil.which(CROSS)
    assert find_compiler(None, x86_host.triple) == shutil.which("cc")  # this machine's: the system compiler
    assert find_compiler("gcc", AARCH64) == shutil.which("gcc")  # one asked for by name wins


def test_a_missing_cross_compiler_names_its_package(x86_host, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(BuildError, match=f"no {CROSS} found to link the library for {AARCH64}: "
                                         "apt-get install gcc-aarch64-linux-gnu"):
        find_compiler(None, AARCH64)
    with pytest.raises(BuildError, match="no cross C compiler known for riscv64-unknown-linux-gnu's architecture"):
        find_compiler(None, "riscv64-unknown-linux-gnu")


@needs_cross
def test_build_for_aarch64_writes_an_aarch64_library(x86_host, tmp_path):
    res = tunaflow("build", ROOT / "data/models/mlp.onnx", "-o", tmp_path / "lib", "--target", "aarch64", timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    head = (tmp_path / "lib/model.so").read_bytes()[:20]
    assert head[:4] == b"\x7fELF" and int.from_bytes(head[18:20], "little") == 183  # EM_AARCH64

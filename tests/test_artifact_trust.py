"""An artifact cannot lie about its buffers: a real build of the bundled MLP, edited as an attacker would,
loaded and called in a child process (an out-of-bounds access kills only the child)."""

import json
from pathlib import Path

import numpy as np
import pytest

from schemas import Target
from schemas.manifest import FORMAT_VERSION, LIBRARY, MANIFEST, SIGNATURE, WEIGHTS
from stages.build.facts import SECTION, Facts
from stages.build.library import build_library
from stages.extract import load_model
from stages.graph.passes import optimize
from stages.runtime import LoadError, load
from stages.runtime.elf import Elf
from stages.runtime.loader import Model, read_manifest, verify
from testing import tamper_artifact as ta

KEY = "test-artifact-key"
MLP = Path(__file__).resolve().parent.parent / "data" / "models" / "mlp.onnx"


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The MLP built with a key: manifest.sig beside it (ignored by a loader that requires no key)."""
    out = tmp_path_factory.mktemp("artifact") / "base"
    build_library(optimize(load_model(MLP)), Target.host(), out, key=KEY)
    return out


def _copy(base: Path, tmp_path: Path, name: str = "lib") -> Path:
    return ta.copy(base, tmp_path / name)


def _refused(attempt: ta.Attempt, fragment: str) -> None:
    assert not attempt.crashed, attempt.stderr[-2000:]
    assert attempt.refused is not None and fragment in attempt.refused, attempt.summary()


def test_the_library_embeds_its_facts_and_the_honest_artifact_loads(base):
    facts = Facts.model_validate_json(Elf((base / LIBRARY).read_bytes()).section(SECTION).rstrip(b"\0"))
    manifest = json.loads((base / MANIFEST).read_text())
    assert facts.format_version == FORMAT_VERSION == manifest["format_version"] == 3
    assert facts.workspace_bytes == manifest["workspace_bytes"] and facts.weights_bytes == manifest["weights_bytes"]
    assert facts.weights_sha256 == manifest["files"][WEIGHTS] and facts.calls == 4
    assert [i.model_dump(mode="json") for i in facts.inputs] == manifest["inputs"]
    for key in (None, KEY):
        ran = ta.attempt(base, key=key)
        assert ran.returncode == 0 and ran.outputs == {"probs": [16, 10]}, ran.summary()
    model = load(base, key=KEY)
    assert model._lib._name.startswith("/proc/self/fd/")  # the checked bytes, not the path
    assert model(np.zeros((16, 784), np.float32)).shape == (16, 10)


@pytest.mark.parametrize("name,edit,fragment", [
    ("files emptied, then the workspace shrunk", lambda d: d.update(files={}, workspace_bytes=64),
     "files must list the sha256 of model.so and weights.bin"),
    ("weights digest dropped", lambda d: d["files"].pop(WEIGHTS), "missing: ['weights.bin']"),
    ("an extra file listed", lambda d: d["files"].update({"extra.so": "0" * 64}), "unknown: ['extra.so']"),
    ("input shape halved", lambda d: d["inputs"][0].update(shape=[8, 784]), "disagrees with the facts model.so embeds"
     " on inputs"),
    ("output shape halved", lambda d: d["outputs"][0].update(shape=[8, 10]), "on outputs"),
    ("workspace shrunk", lambda d: d.update(workspace_bytes=64), "on workspace_bytes (library 24576, manifest 64)"),
    ("workspace shrunk, digests recomputed", lambda d: d.update(workspace_bytes=64), "on workspace_bytes"),
    ("weights size shrunk", lambda d: d.update(weights_bytes=1024), "on weights_bytes (library 943680, manifest 1024)"),
    ("output shape halved, digests recomputed", lambda d: d["outputs"][0].update(shape=[8, 10]), "on outputs"),
    ("threads", lambda d: d.update(threads=4), "on threads"),
    ("format 99", lambda d: d.update(format_version=99), "artifact format 99, newer than this tunaflow's (3)"),
    ("format 1", lambda d: d.update(format_version=1), "written by an older tunaflow; this one loads format 3 only:"
     " rebuild it"),
])
def test_a_manifest_that_lies_is_refused_before_anything_runs(base, tmp_path, name, edit, fragment):
    lib = _copy(base, tmp_path)
    ta.edit_manifest(lib, edit, redigest="recomputed" in name)
    _refused(ta.attempt(lib), fragment)


def test_shorter_weights_with_recomputed_digests_are_refused(base, tmp_path):
    lib = _copy(base, tmp_path)
    data = (lib / WEIGHTS).read_bytes()
    (lib / WEIGHTS).write_bytes(data[:len(data) // 2])
    ta.edit_manifest(lib, lambda d: d.update(weights_bytes=len(data) // 2), redigest=True)
    _refused(ta.attempt(lib), f"on weights_bytes (library {len(data)}, manifest {len(data) // 2})")


def test_trimmed_ops_cannot_shrink_the_profile_buffer(base, tmp_path):
    """tf_profile writes one double per kernel call: the count is the library's, not the manifest's ops."""
    lib = _copy(base, tmp_path)
    ta.edit_manifest(lib, lambda d: d.update(ops=d["ops"][:1]))
    _refused(ta.attempt(lib, profile=True), "on calls (library 4, manifest 1)")
    assert ta.attempt(base, profile=True).returncode == 0


def test_a_constructor_library_with_a_recomputed_digest_never_runs(base, tmp_path):
    marker = tmp_path / "ran"
    lib = _copy(base, tmp_path)
    ta.forge_library(lib, marker, copy_facts=False)
    ta.edit_manifest(lib, lambda d: None, redigest=True)
    _refused(ta.attempt(lib), "embeds no facts (.tunaflow_facts)")
    assert not marker.exists()


@pytest.mark.parametrize("signature", ["stale", "removed", "attacker's key"])
def test_with_the_key_required_a_forged_library_never_runs(base, tmp_path, signature):
    """Facts copied from the honest library, digest recomputed: only the key can tell."""
    marker = tmp_path / "ran"
    lib = _copy(base, tmp_path)
    ta.forge_library(lib, marker)
    ta.edit_manifest(lib, lambda d: None, redigest=True)
    if signature == "removed":
        (lib / SIGNATURE).unlink()
    elif signature == "attacker's key":
        ta.sign(lib, b"not-the-key")
    fragment = "manifest.sig is missing" if signature == "removed" else "manifest.sig does not match manifest.json"
    _refused(ta.attempt(lib, key=KEY), fragment)
    assert not marker.exists()
    with pytest.raises(LoadError, match="under the required key" if signature != "removed" else "is missing"):
        load(lib, key=KEY.encode())
    assert not marker.exists()


def test_a_manifest_unsigned_or_resigned_is_refused_by_a_loader_with_a_key(base, tmp_path):
    lib = _copy(base, tmp_path)
    ta.edit_manifest(lib, lambda d: d.update(build_s=0.0))  # harmless field: the signature covers every byte
    with pytest.raises(LoadError, match="does not match manifest.json under the required key"):
        load(lib, key=KEY)
    load(lib)  # no key required: a harmless edit loads
    ta.sign(lib, KEY.encode())
    assert load(lib, key=KEY).manifest.build_s == 0.0
    with pytest.raises(LoadError, match="signed with another key"):
        load(lib, key="another")


def test_a_build_without_a_key_leaves_no_stale_signature(base, tmp_path):
    lib = _copy(base, tmp_path)
    build_library(optimize(load_model(MLP)), Target.host(), lib, key="")
    assert not (lib / SIGNATURE).exists()
    with pytest.raises(LoadError, match="manifest.sig is missing and a key is required"):
        load(lib, key=KEY)


def test_a_verified_build_without_a_key_over_a_signed_library_leaves_no_stale_signature(base, tmp_path,
                                                                                         monkeypatch):
    from stages.build.verify import build_verified

    monkeypatch.delenv("TUNAFLOW_ARTIFACT_KEY", raising=False)
    lib = _copy(base, tmp_path)
    build_verified(MLP, optimize(load_model(MLP)), Target.host(), lib)
    assert not (lib / SIGNATURE).exists()
    load(lib)


def test_a_library_that_needs_a_foreign_library_is_refused(base, tmp_path):
    marker, own = tmp_path / "helper-ran", tmp_path / "own-ran"
    helper = ta.helper_library(tmp_path / "helper.so", marker)
    lib = _copy(base, tmp_path)
    ta.forge_library(lib, own, needs=helper)
    ta.edit_manifest(lib, lambda d: None, redigest=True)
    _refused(ta.attempt(lib), f"needs ['{helper}']")
    assert not marker.exists() and not own.exists()


def test_a_library_whose_exported_facts_differ_from_its_section_is_refused(base, tmp_path):
    lib = _copy(base, tmp_path)
    ta.forge_library(lib, tmp_path / "ran", exported=b'{"workspace_bytes":64}\0')
    ta.edit_manifest(lib, lambda d: None, redigest=True)
    _refused(ta.attempt(lib), "exports facts (tf_facts) other than its .tunaflow_facts section says")


def test_a_library_swapped_in_after_the_check_is_never_loaded(base, tmp_path):
    marker = tmp_path / "ran"
    lib = _copy(base, tmp_path)
    checked = verify(lib, read_manifest(lib))
    ta.forge_library(lib, marker)  # the file changes between the check and dlopen
    model = Model(checked)
    assert not marker.exists()
    x = np.random.default_rng(0).standard_normal((16, 784)).astype(np.float32)
    np.testing.assert_array_equal(model(x), load(base)(x))


@pytest.mark.parametrize("cut", ["empty", "header only", "not ELF", "truncated"])
def test_a_library_that_is_not_a_whole_elf_file_is_refused_cleanly(base, tmp_path, cut):
    """The old loader died of SIGBUS dlopening the truncated one: a child process does the loading."""
    lib = _copy(base, tmp_path)
    whole = (lib / LIBRARY).read_bytes()
    data = {"empty": b"", "header only": whole[:64], "not ELF": b"not a library at all", "truncated": whole[:3000]}
    (lib / LIBRARY).write_bytes(data[cut])
    ta.edit_manifest(lib, lambda d: None, redigest=True)
    _refused(ta.attempt(lib), "is not a shared library tunaflow can check")


@pytest.mark.parametrize("feeds,profile,fragment", [
    ([([16, 785], "float32")], False, "must have shape [16, 784], got [16, 785]"),
    ([([16, 784], "float64")], False, "must be float32, got float64"),
    ([([16 * 784 // 2], "float32")], False, "must have shape [16, 784], got [6272]"),
    ([([8, 784], "float32")], True, "must have shape [16, 784], got [8, 784]"),
    ([([16, 784], "float32"), ([1], "float32")], False, "takes 1 input(s)"),
])
def test_buffers_of_the_wrong_shape_dtype_or_size_are_refused(base, feeds, profile, fragment):
    _refused(ta.attempt(base, feeds=feeds, profile=profile), fragment)


def test_odd_but_right_buffers_are_copied_not_trusted(base):
    model = load(base)
    x = np.random.default_rng(1).standard_normal((1, 784)).astype(np.float32)
    wide = np.broadcast_to(x, (16, 784))  # right shape, zero strides
    np.testing.assert_array_equal(model(wide), model(np.ascontiguousarray(wide)))
    with pytest.raises(LoadError, match="must be float32, got float64"):
        model(wide.tolist())
    with pytest.raises(LoadError, match=r"must have shape \[16, 784\]"):
        model.bench(1, np.zeros((16, 700), np.float32))


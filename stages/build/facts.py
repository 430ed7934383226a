"""What a built library says about itself, embedded in the library so a manifest cannot lie about it.

`tf_run` takes bare pointers: the shapes, the workspace and weights sizes it was compiled for decide
how far it reads and writes, and `tf_profile` writes one `double` per kernel call. Those facts are
compact JSON in a constant global `tf_facts`, placed in its own ELF section `.tunaflow_facts`: the
loader reads the section from the file without dlopen (which would run the library's constructors),
checks the manifest against it before anything runs, and after loading checks the exported symbol
against the section again.
"""

from __future__ import annotations

from llvmlite import ir
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from schemas.manifest import WEIGHTS, Manifest, TensorInfo

SECTION = ".tunaflow_facts"
SYMBOL = "tf_facts"


class Facts(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    workspace_bytes: int = Field(ge=0)
    weights_bytes: int = Field(ge=0)
    weights_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    calls: int = Field(ge=0)  # kernel calls: the entries `tf_profile` writes into `seconds`
    threads: int = Field(ge=1)
    triple: str
    cpu: str
    features: str

    def encode(self) -> bytes:
        return self.model_dump_json().encode()


def decode(data: bytes) -> Facts:
    """The facts from a section's bytes (trailing NULs ignored); ValueError naming the first bad field."""
    try:
        return Facts.model_validate_json(data.rstrip(b"\0"))
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ValueError(f"{'.'.join(map(str, err['loc'])) or 'facts'}: {err['msg']}") from None


def emit(module: ir.Module, facts: Facts) -> None:
    """`tf_facts` in `module`: exported (the loaded library can be asked), in SECTION (the file can be read)."""
    data = bytearray(facts.encode() + b"\0")
    typ = ir.ArrayType(ir.IntType(8), len(data))
    g = ir.GlobalVariable(module, typ, name=SYMBOL)
    g.global_constant = True
    g.initializer = ir.Constant(typ, data)
    g.section = SECTION
    g.align = 1


def claims(manifest: Manifest) -> dict:
    """What `manifest` says the library's facts are, field by field (unvalidated: it is to be compared)."""
    return {"format_version": manifest.format_version,
            "inputs": [i.model_dump(mode="json") for i in manifest.inputs],
            "outputs": [o.model_dump(mode="json") for o in manifest.outputs],
            "workspace_bytes": manifest.workspace_bytes, "weights_bytes": manifest.weights_bytes,
            "weights_sha256": manifest.files.get(WEIGHTS),
            "calls": sum(1 for op in manifest.ops if op.kind != "alias"), "threads": manifest.threads,
            "triple": manifest.target.triple, "cpu": manifest.target.cpu, "features": manifest.target.features}


def disagreements(library: Facts, manifest: Manifest) -> list[str]:
    """Each field where the manifest says other than the library, as `field (library X, manifest Y)`."""
    own, said = library.model_dump(mode="json"), claims(manifest)
    return [f"{k} (library {_short(own[k])}, manifest {_short(said[k])})" for k in said if own[k] != said[k]]


def _short(value: object) -> str:
    text = str(value)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):  # a sha256
        return text[:12] + "..."
    return text if len(text) <= 80 else text[:77] + "..."

"""Layout ops become aliases where they move no element, and one copy where they would be several.

`unit_transposes_to_reshapes`: ViT-B/16's exporter writes `Transpose(perm=[1, 0, 2])` of a `[1, 197, 768]`
tensor before every attention block; the elements keep their order in memory, yet each one was a copy
kernel. The dims of size > 1 keep their relative order exactly when the permutation is a reshape; then the
node becomes `Reshape(shape=<its output shape>)`.

`compose_copies`: a Slice or Transpose whose input is another copy (Slice, Transpose, an output of a
Split or an earlier composed one), seen through Reshapes, reads that copy's own input instead: every element
of the result sits at `base + sum(i_d * strides[d])` of the source, so one `StridedCopy(base, strides,
shape)` does the work of the chain. ViT-B/16's Q/K/V split is a Transpose of the qkv projection, three
Slices, a head Transpose each and one more for K^T: eight copies of 197x768 floats per block become three;
BERT's and GPT-2's K^T are two Transposes in a row, now one, and GPT-2's Split of the qkv projection goes.
The first copy stays while anything else reads it; a chain that ends where it began (a Transpose and its
inverse) becomes a Reshape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stages.graph.ir import Graph, Node, contiguous_strides

COPIES = ("Slice", "Transpose", "StridedCopy", "Split")
ALIASES = ("Reshape", "Flatten")


def simplify_views(g: Graph) -> None:
    unit_transposes_to_reshapes(g)
    compose_copies(g)


def unit_transposes_to_reshapes(g: Graph) -> None:
    for node in g.nodes:
        if node.op != "Transpose" or node.inputs[0] not in g.values:
            continue
        shape = g.values[node.inputs[0]].shape
        perm = transpose_perm(node, len(shape))
        if _moves_unit_dims_only(shape, perm):
            node.op, node.attrs = "Reshape", {"shape": [int(shape[d]) for d in perm]}


@dataclass(frozen=True)
class View:
    """Element (i0, i1, ...) of a tensor of `shape` is element `base + sum(i_d * strides[d])` of a flat source."""

    base: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def copy_view(g: Graph, producer: dict[str, Node], name: str) -> tuple[Node, list[Node], View] | None:
    """When run-time tensor `name` is a copy (Slice, Transpose, StridedCopy, a Split output) seen through
    Reshapes: that copy, the Reshapes between (nearest first), and `name` as a view of the copy's input."""
    chain = []
    while (p := producer.get(name)) is not None and p.op in ALIASES:
        chain.append(p)
        name = p.inputs[0]
    if p is None or p.op not in COPIES or p.inputs[0] not in g.values:
        return None
    src = g.values[p.inputs[0]].shape
    view: View | None = _applied(View(0, src, contiguous_strides(src)), p, name, g.values[name].shape)
    for r in reversed(chain):
        view = view and reshaped(view, g.values[r.outputs[0]].shape)
    return None if view is None else (p, chain, view)


def compose_copies(g: Graph) -> None:
    producer = g.producer()
    for node in g.nodes:
        if node.op not in ("Slice", "Transpose") or node.inputs[0] not in g.values \
                or math.prod(g.values[node.outputs[0]].shape) == 0:
            continue
        found = copy_view(g, producer, node.inputs[0])
        view = found and _applied(found[2], node, node.outputs[0], g.values[node.outputs[0]].shape)
        if not view:
            continue
        p = found[0]
        src = g.values[p.inputs[0]].shape
        node.inputs = [p.inputs[0]]
        if view.base == 0 and math.prod(view.shape) == math.prod(src) and _is_contiguous(view):
            node.op, node.attrs = "Reshape", {"shape": list(view.shape)}
        else:
            node.op, node.attrs = "StridedCopy", {"base": view.base, "strides": list(view.strides),
                                                    "shape": list(view.shape)}


def _applied(v: View, node: Node, out: str, out_shape: tuple[int, ...]) -> View:
    """The view `node` makes (as its output `out`) of a tensor that is view `v` of the source."""
    if node.op == "Transpose":
        perm = transpose_perm(node, len(v.shape))
        return View(v.base, tuple(v.shape[d] for d in perm), tuple(v.strides[d] for d in perm))
    if node.op == "Slice":
        starts, steps = (node.attrs[k] for k in ("starts", "steps"))
        base = v.base + sum(int(a) * s for a, s in zip(starts, v.strides, strict=True))
        return View(base, tuple(out_shape), tuple(s * int(st) for s, st in zip(v.strides, steps, strict=True)))
    # Split and StridedCopy are only ever the first copy of a chain: `v` is their input's contiguous layout.
    if node.op == "Split":
        axis = int(node.attrs["axis"]) % len(v.shape)
        at = sum(int(n) for n in node.attrs["split"][:node.outputs.index(out)])
        return View(v.base + at * v.strides[axis], tuple(out_shape), v.strides)
    return View(v.base + int(node.attrs["base"]), tuple(out_shape), tuple(int(s) for s in node.attrs["strides"]))


def reshaped(v: View, shape: tuple[int, ...]) -> View | None:
    """`v` reshaped to `shape` without moving an element, or None when that needs a copy (numpy's rule: each
    run of old dims merged or split must be contiguous within itself)."""
    old = [(n, s) for n, s in zip(v.shape, v.strides, strict=True) if n != 1]
    real = [d for d, n in enumerate(shape) if n != 1]
    strides = [0] * len(shape)
    i = j = 0
    while i < len(old):
        i2, j2, a, b = i + 1, j + 1, old[i][0], shape[real[j]]
        while a != b:
            if a < b:
                a, i2 = a * old[i2][0], i2 + 1
            else:
                b, j2 = b * shape[real[j2]], j2 + 1
        if any(old[k][1] != old[k + 1][1] * old[k + 1][0] for k in range(i, i2 - 1)):
            return None
        step = old[i2 - 1][1]
        for k in range(j2 - 1, j - 1, -1):
            strides[real[k]], step = step, step * shape[real[k]]
        i, j = i2, j2
    return View(v.base, tuple(shape), tuple(strides))


def _is_contiguous(v: View) -> bool:
    return all(s == c for n, s, c in zip(v.shape, v.strides, contiguous_strides(v.shape), strict=True) if n != 1)


def transpose_perm(node: Node, rank: int) -> list[int]:
    """A Transpose's perm; ONNX's default (no attribute) reverses the dims."""
    return [int(p) for p in node.attrs.get("perm") or range(rank - 1, -1, -1)]


def _moves_unit_dims_only(shape: tuple[int, ...], perm: list[int]) -> bool:
    moved = [d for d in perm if shape[d] != 1]
    return moved == sorted(moved)

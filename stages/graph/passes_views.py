"""Layout ops that move no element become aliases (Reshapes), so the build runs them without a copy.

`unit_transposes_to_reshapes`: ViT-B/16's exporter writes `Transpose(perm=[1, 0, 2])` of a `[1, 197, 768]`
tensor before every attention block; the elements keep their order in memory, yet each one was a copy
kernel. The dims of size > 1 keep their relative order exactly when the permutation is a reshape; then the
node becomes `Reshape(shape=<its output shape>)`.

`slices_before_transposes`: the same export splits Q, K and V as `Transpose(perm=[3, 1, 2, 0, 4])` of the
`[1, 197, 1, 3, 768]` projection and three Slices of the leading axis: a copy of the whole tensor, then a
copy of each third. Slicing the Transpose's input along the matching axis first leaves Transposes of unit
dims, which are Reshapes: three copies instead of four. Done only where every reader of the Transpose is
such a Slice (or a Reshape of unit dims read only by Slices), so the Transpose goes.
"""

from __future__ import annotations

from stages.graph.ir import Graph, Node, Value


def simplify_views(g: Graph) -> None:
    slices_before_transposes(g)
    unit_transposes_to_reshapes(g)


def unit_transposes_to_reshapes(g: Graph) -> None:
    for node in g.nodes:
        if node.op != "Transpose" or node.inputs[0] not in g.values:
            continue
        shape = g.values[node.inputs[0]].shape
        perm = _perm(node, len(shape))
        if _moves_unit_dims_only(shape, perm):
            node.op, node.attrs = "Reshape", {"shape": [int(shape[d]) for d in perm]}


def slices_before_transposes(g: Graph) -> None:
    users = g.consumers()
    outputs = {v.name for v in g.outputs}
    rewrites: dict[int, list[Node]] = {}
    for t in g.nodes:
        if t.op != "Transpose" or t.inputs[0] not in g.values or t.outputs[0] in outputs:
            continue
        src = g.values[t.inputs[0]]
        perm = _perm(t, len(src.shape))
        slices = _slice_readers(g, t.outputs[0], users, outputs)
        plans = [_sliced_first(g, s, axes, src, perm) for s, axes in slices or []]
        if slices and all(p is not None for p in plans):
            rewrites.update({id(s): plan for (s, _), plan in zip(slices, plans, strict=True)})
    if rewrites:
        g.nodes = [n for node in g.nodes for n in rewrites.get(id(node), [node])]


def _slice_readers(g: Graph, name: str, users: dict[str, list[Node]],
                   outputs: set[str]) -> list[tuple[Node, list[int | None]]] | None:
    """Every reader of `name` as (Slice, the axis of `name` each of its axes is), looking through Reshapes that
    only add or drop unit dims (ViT's squeeze between the Transpose and its Slices); None if any is not."""
    found: list[tuple[Node, list[int | None]]] = []
    shape = g.values[name].shape
    for r in users.get(name, []):
        if r.op == "Slice":
            found.append((r, list(range(len(shape)))))
            continue
        if r.op != "Reshape" or r.outputs[0] in outputs:
            return None
        rshape = g.values[r.outputs[0]].shape
        real, rreal = [a for a, n in enumerate(shape) if n != 1], [a for a, n in enumerate(rshape) if n != 1]
        readers = users.get(r.outputs[0], [])
        if [shape[a] for a in real] != [rshape[a] for a in rreal] or not readers or \
                any(x.op != "Slice" for x in readers):
            return None
        axes: list[int | None] = [None] * len(rshape)
        for a, b in zip(rreal, real, strict=True):
            axes[a] = b
        found += [(x, axes) for x in readers]
    return found or None


def _sliced_first(g: Graph, s: Node, axes: list[int | None], src: Value, perm: list[int]) -> list[Node] | None:
    """[Slice of the Transpose's input, Reshape to the Slice's output] in place of Slice `s` (whose axis i is
    axis `axes[i]` of the Transpose's output, None for an added unit dim), or None when the Transpose left
    after slicing would move a dim of size > 1 (it would stay a copy: no gain)."""
    rank = len(perm)
    starts, steps, sizes = [0] * rank, [1] * rank, [1] * rank
    for i, a in enumerate(axes):
        if a is not None:
            d = perm[a]
            starts[d], steps[d], sizes[d] = (int(s.attrs[k][i]) for k in ("starts", "steps", "sizes"))
    if not _moves_unit_dims_only(tuple(sizes), perm):
        return None
    out = s.outputs[0]
    mid = f"{out}__sliced"
    g.values[mid] = Value(mid, tuple(sizes), src.dtype)
    return [Node(f"{s.name}/sliced", "Slice", [src.name], [mid], {"starts": starts, "steps": steps, "sizes": sizes}),
            Node(s.name, "Reshape", [mid], [out], {"shape": [int(x) for x in g.values[out].shape]})]


def _perm(node: Node, rank: int) -> list[int]:
    return [int(p) for p in node.attrs.get("perm") or range(rank - 1, -1, -1)]


def _moves_unit_dims_only(shape: tuple[int, ...], perm: list[int]) -> bool:
    moved = [d for d in perm if shape[d] != 1]
    return moved == sorted(moved)

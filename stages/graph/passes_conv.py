"""Conv rewrites that change no result, only the work.

`prune_padding_taps`: a dilated window wider than the image reads only zero padding at some of its taps,
whatever the output position (DeepLabV3's ASPP convs: 3x3 at dilation 24 and 36, padded as much, on a
14x14 map: every tap but the centre). Those rows and columns of the kernel are dropped and the padding
shrunk to match, so the output and every product that reads the image stay as they were: those two
960 -> 256 convs become 1x1 convs, 9x fewer multiplies (they took 22 of the model's 40 ms).

`split_sparse_taps`: where the taps left still read padding for most output positions (the same ASPP's
dilation-12 conv: its outer taps reach the 14x14 image from 2 output rows or columns only, 18% of its
multiplies read the image), the conv becomes one 1x1 conv per tap over just the outputs that tap reaches, each
padded with zeros to the full output and summed (the bias rides on a tap that covers every output, else it is
added to the first): the multiplies by
padding are gone; a Pad and an Add per tap cost a pass over the output each.
"""

from __future__ import annotations

from stages.graph.ir import Graph, Node, Value

SPARSE = 0.5  # split a conv whose taps reach the image at fewer than this share of its (tap, output) pairs
MIN_SAVED_MACS = 20_000_000  # ... and saves this many multiply-adds (~0.1 ms): each tap costs 2-3 kernel calls, so
# a 3x3 conv on a 2x2 image (44% live) would not pay for its 25 nodes


def _live_taps(size: int, out: int, k: int, stride: int, dilation: int, pad: int) -> tuple[int, int]:
    """First and last tap of a window axis that reads inside the image for some output position."""
    live = [r for r in range(k) if (reach := _reach(size, out, stride, dilation, pad, r))[1] > reach[0]]
    return (live[0], live[-1]) if live else (0, k - 1)


def prune_padding_taps(g: Graph) -> None:
    for node in g.nodes:
        if node.op != "Conv" or len(node.inputs) < 2 or node.inputs[1] not in g.constants:
            continue
        w = g.constants[node.inputs[1]]
        if w.ndim != 4:
            continue
        (_, _, h, wd), (_, _, oh, ow) = g.values[node.inputs[0]].shape, g.values[node.outputs[0]].shape
        (sh, sw), (dh, dw), (pt, pl, pb, pr) = node.attrs["strides"], node.attrs["dilations"], node.attrs["pads"]
        r0, r1 = _live_taps(h, oh, w.shape[2], sh, dh, pt)
        c0, c1 = _live_taps(wd, ow, w.shape[3], sw, dw, pl)
        pads = [pt - r0 * dh, pl - c0 * dw, pb - (w.shape[2] - 1 - r1) * dh, pr - (w.shape[3] - 1 - c1) * dw]
        if (r0, r1, c0, c1) == (0, w.shape[2] - 1, 0, w.shape[3] - 1) or min(pads) < 0:
            continue
        kept = w[:, :, r0:r1 + 1, c0:c1 + 1]
        node.inputs = [node.inputs[0], g.add_constant(node.name + ".w_taps", kept.copy()), *node.inputs[2:]]
        node.attrs = {**node.attrs, "pads": pads,
                      "dilations": [dh if kept.shape[2] > 1 else 1, dw if kept.shape[3] > 1 else 1]}


def _reach(size: int, out: int, stride: int, dilation: int, pad: int, r: int) -> tuple[int, int]:
    """The output positions [first, end) at which tap `r` of a window axis reads inside the image."""
    first = max(0, -(-(pad - r * dilation) // stride))
    end = min(out, (size - 1 + pad - r * dilation) // stride + 1)
    return first, max(first, end)


def split_sparse_taps(g: Graph) -> None:
    out_nodes = []
    for node in g.nodes:
        pieces = _split(g, node) if node.op == "Conv" else None
        out_nodes.extend(pieces or [node])
    g.nodes = out_nodes


def _split(g: Graph, node: Node) -> list[Node] | None:
    if len(node.inputs) < 2 or any(i not in g.constants for i in node.inputs[1:]) or \
            int(node.attrs.get("group", 1)) != 1:
        return None
    w = g.constants[node.inputs[1]]
    (n, c, h, wd), (_, k, oh, ow) = g.values[node.inputs[0]].shape, g.values[node.outputs[0]].shape
    (sh, sw), (dh, dw), (pt, pl, _, _) = node.attrs["strides"], node.attrs["dilations"], node.attrs["pads"]
    rows = [_reach(h, oh, sh, dh, pt, r) for r in range(w.shape[2])]
    cols = [_reach(wd, ow, sw, dw, pl, q) for q in range(w.shape[3])]
    taps = [(r, q) for r in range(w.shape[2]) for q in range(w.shape[3])
            if rows[r][1] > rows[r][0] and cols[q][1] > cols[q][0]]
    live = sum((rows[r][1] - rows[r][0]) * (cols[q][1] - cols[q][0]) for r, q in taps)
    pairs = w.shape[2] * w.shape[3] * oh * ow
    if len(taps) < 2 or live >= SPARSE * pairs or (pairs - live) * n * k * c < MIN_SAVED_MACS:
        return None
    taps.sort(key=lambda t: -(rows[t[0]][1] - rows[t[0]][0]) * (cols[t[1]][1] - cols[t[1]][0]))  # widest first
    nodes, total = [], None
    for i, (r, q) in enumerate(taps):
        (r0, r1), (q0, q1) = rows[r], cols[q]
        tag = f"{node.name}/tap{r}_{q}"
        src = node.inputs[0]
        starts = [0, 0, r0 * sh - pt + r * dh, q0 * sw - pl + q * dw]
        sizes = [n, c, r1 - r0, q1 - q0]
        if (starts[2:], sizes[2:], sh, sw) != ([0, 0], [h, wd], 1, 1):
            src = f"{tag}/x"
            g.values[src] = Value(src, tuple(sizes))
            nodes.append(Node(f"{tag}/slice", "Slice", [node.inputs[0]], [src],
                              {"starts": starts, "steps": [1, 1, sh, sw], "sizes": sizes}))
        weight = g.add_constant(f"{tag}.w", w[:, :, r:r + 1, q:q + 1].copy())
        part = f"{tag}/y"
        g.values[part] = Value(part, (n, k, r1 - r0, q1 - q0))
        whole = (r1 - r0, q1 - q0) == (oh, ow)
        bias = node.inputs[2:] if i == 0 and whole else []
        nodes.append(Node(f"{tag}/conv", "Conv", [src, weight, *bias], [part],
                          {"strides": [1, 1], "dilations": [1, 1], "group": 1, "pads": [0, 0, 0, 0]}))
        if not whole:  # the tap's outputs into the full output, zeros elsewhere
            full = f"{tag}/full"
            g.values[full] = Value(full, (n, k, oh, ow))
            nodes.append(Node(f"{tag}/pad", "Pad", [part], [full],
                              {"pads": [0, 0, r0, q0, 0, 0, oh - r1, ow - q1], "mode": "constant", "value": 0.0}))
            part = full
        if total is not None or i == 0 and not whole and len(node.inputs) > 2:
            addend = total if total is not None else g.add_constant(f"{node.name}.bias",
                                                                    g.constants[node.inputs[2]].reshape(1, k, 1, 1))
            summed = node.outputs[0] if i == len(taps) - 1 else f"{tag}/sum"
            g.values[summed] = g.values.get(summed) or Value(summed, (n, k, oh, ow))
            nodes.append(Node(f"{tag}/add", "Add", [part, addend], [summed]))
            part = summed
        total = part
    return nodes

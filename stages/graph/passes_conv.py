"""Conv rewrites that change no result, only the work.

`prune_padding_taps`: a dilated window wider than the image reads only zero padding at some of its taps,
whatever the output position (DeepLabV3's ASPP convs: 3x3 at dilation 24 and 36, padded as much, on a
14x14 map: every tap but the centre). Those rows and columns of the kernel are dropped and the padding
shrunk to match, so the output and every product that reads the image stay as they were: those two
960 -> 256 convs become 1x1 convs, 9x fewer multiplies (they took 22 of the model's 40 ms).
"""

from __future__ import annotations

from stages.graph.ir import Graph


def _live_taps(size: int, out: int, k: int, stride: int, dilation: int, pad: int) -> tuple[int, int]:
    """First and last tap of a window axis that reads inside the image for some output position."""
    live = [r for r in range(k) if r * dilation - pad <= size - 1 and (out - 1) * stride - pad + r * dilation >= 0]
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

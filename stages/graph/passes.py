"""Graph passes run after import, in order (`optimize`):

0. `quantize_graph` (passes_quant.py): quantized (QDQ) anchors become int8 `qconv2d` / `qdense` nodes,
   max pool / reshape / concat between equal quantization parameters run on the integers, the
   remaining constant DequantizeLinear nodes fold into float constants; `assign_int8_tasks` (qtasks.py)
   gives each int8 anchor the tuning task its template serves.
1. `fold_batchnorm`: a BatchNormalization right after a Conv or Gemm with constant weights is
   folded into the weights and bias (free at run time); any other one becomes Mul + Add by
   per-channel constants, which the fusion pass can still absorb as a scale_shift.
   `prune_padding_taps` (passes_conv.py): kernel rows and columns of a dilated conv that read only
   zero padding are dropped (DeepLabV3's ASPP at dilation 24 and 36 on 14x14: 1x1 convs);
   `split_sparse_taps`: a conv whose taps mostly read padding becomes one 1x1 conv per tap over the
   outputs it reaches, summed by residual-add epilogues.
2. `rewrite_activations` (passes_act.py): activations written out as element-wise ops (Gelu's erf
   and tanh forms, x * Sigmoid(x), HardSigmoid as relu6(x + 3) / 6, HardSwish as x * HardSigmoid(x))
   become one node each, which the fusion pass absorbs as one epilogue op.
3. `rewrite_layernorm` (passes_norm.py): the opset < 17 decomposition of layer normalisation
   (ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, Mul, Add) becomes one LayerNormalization.
   `simplify_views` (passes_views.py): a Transpose that only moves unit dims is a Reshape (an alias at
   run time, not a copy); a copy of a copy (Slices and Transposes, through Reshapes) is one StridedCopy.
4. `fuse_attention_softmax` (passes_transformer.py): attention's scale, mask add, softmax and NaN guard
   after Q K^T become one AttentionSoftmax row kernel.
5. `fuse` (passes_fuse.py): every Conv / Gemm / MatMul becomes an anchor node with a TuningTask
   and absorbs the element-wise chain after it into the task's epilogue.
6. `fuse_add_layernorm` (passes_norm.py): a LayerNormalization of a chain of Adds no anchor absorbed (the
   embedding sums) becomes one AddLayerNormalization row kernel.
7. `eliminate_dead`: nodes nobody reads, and constants nobody reads, are dropped.

Layout: activations stay NCHW between nodes; the conv2d template re-lays its weights (and blocks
its input internally) itself, so no layout-transform nodes are needed between convolutions.
"""

from __future__ import annotations

import copy

import numpy as np

from stages.graph.ir import Graph, Node, Value
from stages.graph.passes_act import rewrite_activations
from stages.graph.passes_chain import fuse_chains
from stages.graph.passes_conv import prune_padding_taps, split_sparse_taps
from stages.graph.passes_fuse import fuse
from stages.graph.passes_norm import fuse_add_layernorm, rewrite_layernorm
from stages.graph.passes_quant import quantize_graph
from stages.graph.passes_transformer import fuse_attention_softmax
from stages.graph.passes_views import simplify_views
from stages.graph.qtasks import assign_int8_tasks


def optimize(graph: Graph) -> Graph:
    """A new graph with every pass applied; the input graph is left as it was (constant arrays are shared:
    passes add new constants, they never write into existing ones)."""
    g = copy.deepcopy(graph, memo={id(a): a for a in graph.constants.values()})
    for p in (quantize_graph, assign_int8_tasks, fold_batchnorm, prune_padding_taps, split_sparse_taps,
              rewrite_activations, rewrite_layernorm,
              simplify_views, fuse_attention_softmax, fuse, fuse_add_layernorm, fuse_chains, eliminate_dead):
        p(g)
    return g


def fold_batchnorm(g: Graph) -> None:
    users = g.consumers()
    prod = g.producer()
    drop: set[int] = set()
    for bn in [n for n in g.nodes if n.op == "BatchNormalization"]:
        scale, beta, mean, var = (g.constants[i].astype(np.float64) for i in bn.inputs[1:])
        s = scale / np.sqrt(var + bn.attrs["epsilon"])
        t = beta - mean * s
        src = prod.get(bn.inputs[0])
        if src is not None and g.sole_consumer(bn.inputs[0], users) is bn and _fold_into(g, src, s, t):
            src.outputs = [bn.outputs[0]]
            drop.add(id(bn))
            continue
        shape = (-1,) + (1,) * (len(g.values[bn.inputs[0]].shape) - 2)
        mid = bn.outputs[0] + "/scaled"
        g.values[mid] = Value(mid, g.values[bn.outputs[0]].shape)
        s_name = g.add_constant(bn.name + ".scale", s.reshape(shape))
        t_name = g.add_constant(bn.name + ".shift", t.reshape(shape))
        i = g.nodes.index(bn)
        g.nodes[i: i + 1] = [Node(bn.name + "/mul", "Mul", [bn.inputs[0], s_name], [mid]),
                             Node(bn.name + "/add", "Add", [mid, t_name], list(bn.outputs))]
    g.nodes = [n for n in g.nodes if id(n) not in drop]


def _fold_into(g: Graph, src: Node, s: np.ndarray, t: np.ndarray) -> bool:
    """Scale the output channels of a Conv or Gemm with constant weights by s, then add t."""
    if src.op not in ("Conv", "Gemm") or any(i not in g.constants for i in src.inputs[1:]):
        return False
    w = g.constants[src.inputs[1]].astype(np.float64)
    if src.op == "Conv":
        w2 = w * s.reshape(-1, 1, 1, 1)
        bias = g.constants[src.inputs[2]].astype(np.float64) if len(src.inputs) > 2 else 0.0
        b2 = bias * s + t
    else:
        w2 = w * s.reshape(-1, 1) if src.attrs["transB"] else w * s.reshape(1, -1)
        c = src.attrs["beta"] * g.constants[src.inputs[2]].astype(np.float64) if len(src.inputs) > 2 else 0.0
        b2 = np.broadcast_to(c * s + t, np.broadcast_shapes(np.shape(c * s), t.shape))
        src.attrs = {**src.attrs, "beta": 1.0}
    src.inputs = [src.inputs[0], g.add_constant(src.name + ".w_bn", w2), g.add_constant(src.name + ".b_bn", b2)]
    return True


def eliminate_dead(g: Graph) -> None:
    """Drop nodes whose outputs nobody reads (walking backwards), then unread constants and values."""
    live = {v.name for v in g.outputs}
    kept = []
    for node in reversed(g.nodes):
        if any(o in live for o in node.outputs):
            kept.append(node)
            live.update(node.inputs)
    g.nodes = kept[::-1]
    live.update(o for node in kept for o in node.outputs)  # a kept node still writes every output (a Split)
    g.constants = {k: v for k, v in g.constants.items() if k in live}
    g.values = {k: v for k, v in g.values.items() if k in live or any(k == i.name for i in g.inputs)}

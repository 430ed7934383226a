"""Einsum as the ops tunaflow already runs, so its products are tuned anchors like any MatMul.

Two operands at a time, left to right: letters only one operand has and nothing later needs are summed
first (ReduceSum); each operand is transposed into [batch, free, contracted] order and reshaped to 3-D (2-D
without batch letters), one MatMul multiplies them (a `batch_matmul` anchor, or `dense` when the second is a
constant), and the product is reshaped back and transposed into the order the rest of the equation wants.
MaxViT writes its attention this way (`B G H I D, B G H J D -> B G H I J`, a batched Q K^T). One operand is
a ReduceSum and a Transpose. Ellipses and a letter repeated within one operand (a diagonal) are refused.
"""

from __future__ import annotations

import math
from string import ascii_letters

from schemas.errors import ModelError
from stages.extract.normalize import Ctx, Emit


def _parse(equation: str, ranks: list[int], ctx: Ctx) -> tuple[list[str], str]:
    eq = equation.replace(" ", "")
    lhs, arrow, out = eq.partition("->")
    terms = lhs.split(",")
    where = f"Einsum {ctx.node!r} ({equation!r})"
    if "." in eq:
        raise ModelError(f"{where}: ellipses ('...') are not supported; write every axis as a letter")
    if len(terms) != len(ranks):
        raise ModelError(f"{where}: {len(terms)} operand terms for {len(ranks)} inputs")
    for term, rank in zip(terms, ranks, strict=True):
        if any(c not in ascii_letters for c in term) or len(term) != rank:
            raise ModelError(f"{where}: term {term!r} must name each of its operand's {rank} axes by one letter")
        if len(set(term)) != len(term):
            raise ModelError(f"{where}: term {term!r} repeats a letter (a diagonal), which is not supported")
    if not arrow:  # implicit output: the letters used once, alphabetically
        out = "".join(sorted(c for c in set(lhs) if c in ascii_letters and lhs.count(c) == 1))
    if len(set(out)) != len(out) or any(c not in lhs for c in out):
        raise ModelError(f"{where}: output {out!r} must name distinct letters of the operands")
    return terms, out


class _Chain:
    """The emitted nodes and the shapes of the tensors they make."""

    def __init__(self, ctx: Ctx, final: str):
        self.ctx, self.final, self.emits = ctx, final, []

    def add(self, op: str, ins: list[str], attrs: dict, last: bool = False) -> str:
        out = self.final if last else self.ctx.fresh(self.final)
        self.emits.append((op, ins, [out], attrs))
        return out


def _sum_away(chain: _Chain, name: str, term: str, keep: set[str], last: bool) -> tuple[str, str]:
    """Sum the axes of `name` whose letters are not in `keep`."""
    axes = [i for i, c in enumerate(term) if c not in keep]
    if not axes:
        return name, term
    return chain.add("ReduceSum", [name], {"axes": axes, "keepdims": 0}, last), "".join(
        c for c in term if c in keep)


def _transpose(chain: _Chain, name: str, term: str, order: str, last: bool = False) -> str:
    if term == order:
        return name
    return chain.add("Transpose", [name], {"perm": [term.index(c) for c in order]}, last)


def _reshape(chain: _Chain, name: str, shape: list[int], last: bool = False) -> str:
    return chain.add("Reshape", [name], {"shape": shape}, last)


def _pair(chain: _Chain, a: tuple[str, str], b: tuple[str, str], want: str, dims: dict[str, int],
          last: bool) -> tuple[str, str]:
    """The product of two operands (name, term) keeping the letters of `want`, in the order [batch, free of a,
    free of b]; with `last` (`want` is then the output) it is the chain's final tensor if that order is `want`."""
    (an, at), (bn, bt) = a, b
    an, at = _sum_away(chain, an, at, set(bt) | set(want), False)
    bn, bt = _sum_away(chain, bn, bt, set(at) | set(want), False)
    batch = [c for c in at if c in bt and c in want]
    contract = [c for c in at if c in bt and c not in want]
    free_a = [c for c in at if c not in bt]
    free_b = [c for c in bt if c not in at]
    size = lambda letters: math.prod(dims[c] for c in letters)  # noqa: E731
    lead = [size(batch)] if batch else []
    an = _transpose(chain, an, at, "".join(batch + free_a + contract))
    bn = _transpose(chain, bn, bt, "".join(batch + contract + free_b))
    an = _reshape(chain, an, [*lead, size(free_a), size(contract)])
    bn = _reshape(chain, bn, [*lead, size(contract), size(free_b)])
    product = chain.add("MatMul", [an, bn], {})
    term = "".join(batch + free_a + free_b)
    return _reshape(chain, product, [dims[c] for c in term], last and term == want), term


def einsum(ins, outs, raw, ctx: Ctx) -> list[Emit]:
    if any(ctx.dtype(i) != "float32" for i in ins):
        raise ModelError(f"Einsum {ctx.node!r}: its operands are {[ctx.dtype(i) for i in ins]}; float32 only")
    equation = raw["equation"].decode() if isinstance(raw["equation"], bytes) else str(raw["equation"])
    shapes = [ctx.shape(i) for i in ins]
    terms, out = _parse(equation, [len(s) for s in shapes], ctx)
    dims: dict[str, int] = {}
    for term, shape in zip(terms, shapes, strict=True):
        for c, d in zip(term, shape, strict=True):
            if dims.setdefault(c, d) != d:
                raise ModelError(f"Einsum {ctx.node!r} ({equation!r}): letter {c!r} is {dims[c]} in one operand "
                                 f"and {d} in another (broadcasting is not supported)")
    chain = _Chain(ctx, outs[0])
    current = (ins[0], terms[0])
    for k in range(1, len(terms)):
        last = k == len(terms) - 1
        later = set(out).union(*terms[k + 1:])
        want = out if last else "".join(c for c in dict.fromkeys(current[1] + terms[k]) if c in later)
        current = _pair(chain, current, (ins[k], terms[k]), want, dims, last)
    name, term = current
    if len(terms) == 1:
        name, term = _sum_away(chain, name, term, set(out), "".join(c for c in term if c in out) == out)
    if term != out:
        _transpose(chain, name, term, out, last=True)
    elif name != outs[0]:
        _reshape(chain, name, [dims[c] for c in out], last=True)
    return chain.emits


EINSUM_NORMALIZERS = {"Einsum": einsum}

"""The direct conv2d's plan: the compile-time facts the IR emitters and the argument packer share
(the packed input's layout, tile counts, buffer sizes, which pack strategy runs), with no IR.

The pack writes the zero-padded input split into stride phases along both axes,
`Xp[n][c][rph][cph][r][q] = Xpad[n][c][r*sh + rph][q*sw + cph]`, so every window tap reads the
same `oh*wq + ow` grid at a constant offset: a unit-stride vector for any stride and dilation.
With `flat`, the tile runs along that grid as one axis (output rows `wq` apart, the `wq - ow`
padding columns computed and never stored), so narrow layers (28 wide) fill whole vectors.
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.templates.conv2d_shape import ConvGeom

SLAB_MIN_BYTES = 1 << 20  # a packed image past this is packed row tile by row tile into a slab
ITEM_STACK_BYTES = 512 << 10  # a channel block's packed planes go on its thread's stack up to this size


@dataclass(frozen=True)
class Plan:
    """Compile-time facts of one (geometry, knobs, halo) triple, shared by the IR and the argument packer."""

    g: ConvGeom
    vw: int
    mr: int
    nw: int
    rh: int
    icb: int
    order: str
    unroll: int
    uk: int
    ocn: int
    par: str
    flat_grid: int = 0
    axis: str = "w"
    x_padded: bool = False  # X arrives zero-padded (a stride-1 conv's packed layout): no pack
    y_pad: tuple[int, int, int, int] = (0, 0, 0, 0)  # Y is written inside zero borders (top, left, bottom, right)

    def __post_init__(self) -> None:
        if self.x_padded and (self.g.sh, self.g.sw) != (1, 1):
            raise ValueError("only a stride-1 conv reads its padded input as it is")

    @property
    def y_pitch(self) -> int:
        """Floats per row of Y as stored (borders included)."""
        return self.g.ow + self.y_pad[1] + self.y_pad[3]

    @property
    def y_plane(self) -> int:
        return (self.g.oh + self.y_pad[0] + self.y_pad[2]) * self.y_pitch

    @property
    def y_origin(self) -> int:
        """Offset of output (0, 0) in a stored plane."""
        return self.y_pad[0] * self.y_pitch + self.y_pad[1]

    @property
    def oc_vectors(self) -> bool:
        """Vectors of `vw` output channels FMA broadcast input pixels; the tile is transposed into
        pixel vectors before the epilogue and the stores."""
        return self.axis == "oc"

    @property
    def gemm(self) -> bool:
        """A 1x1, stride-1, unpadded conv: a GEMM over the flattened image, read in place."""
        return self.g.is_1x1_gemm

    @property
    def in_place(self) -> bool:
        """X is read as it is: no pack phase, no packed buffer."""
        return self.gemm or self.x_padded

    @property
    def flat(self) -> bool:
        """The tile runs along the `oh*wq` grid as one axis (`rh` is 1)."""
        return bool(self.flat_grid)

    @property
    def hq(self) -> int:
        """Rows of one stride phase of a packed input plane (of the slab's plane, with a slab)."""
        return self.hq_slab if self.slab else self.hq_image

    @property
    def hq_image(self) -> int:
        return -(-(self.g.h + self.g.pt + self.g.pb) // self.g.sh)

    @property
    def hq_slab(self) -> int:
        """Rows per stride phase that one row tile's `span` padded rows fill."""
        return -(-self.span // self.g.sh)

    @property
    def span(self) -> int:
        """Padded input rows one row tile reads."""
        return (self.rh - 1) * self.g.sh + (self.g.kh - 1) * self.g.dh + 1

    @property
    def wq(self) -> int:
        """Columns of one stride phase of a packed input row: the grid's row pitch."""
        return -(-(self.g.w + self.g.pl + self.g.pr) // self.g.sw)

    @property
    def out_h(self) -> int:
        return 1 if self.flat else self.g.oh

    @property
    def out_w(self) -> int:
        """Extent of the tiled column axis (the grid up to the last output when flat)."""
        return (self.g.oh - 1) * self.wq + self.g.ow if self.flat else self.g.ow

    @property
    def tile_w(self) -> int:
        """Columns of the tiled axis one tile covers. Channel-vector tiles broadcast their pixels one by
        one, so a tile narrower than `nw*vw` computes only its own pixels: they split the axis into
        equal tiles (28 columns are two tiles of 14, not 16 + 12 with 4 computed for nothing)."""
        full = self.nw * self.vw
        if not self.oc_vectors:
            return full
        return -(-self.out_w // -(-self.out_w // full))

    @property
    def w_tiles(self) -> int:
        return -(-self.out_w // self.tile_w)

    @property
    def h_tiles(self) -> int:
        return -(-self.out_h // self.rh)

    @property
    def segments(self) -> int:
        """Segments per image: the image itself (par=oc), or its row tiles (column tiles of the grid when flat)."""
        if self.par == "oc":
            return 1
        if self.flat:
            return self.w_tiles
        return self.h_tiles

    def pixels(self, j: int) -> int:
        """Pixels of a channel-vector tile's group `j` (of `vw`) that are computed."""
        return max(0, min(self.vw, self.tile_w - j * self.vw))

    @property
    def accumulators(self) -> int:
        """Vector registers the tile's sums occupy."""
        if self.oc_vectors:
            return self.mr // self.vw * self.rh * self.tile_w
        return self.mr * self.rh * self.nw

    @property
    def segmented(self) -> bool:
        """A flat vector may span output rows: it is stored in pieces that skip the padding columns of
        the grid (`wq` apart) or of a padded Y (`y_pitch` apart): either pitch differing from `ow`."""
        return self.flat and (self.wq != self.g.ow or self.y_pitch != self.g.ow)

    @property
    def plane(self) -> int:
        """Floats per input channel plane as the micro-kernel reads it."""
        return self.g.sh * self.g.sw * self.hq * self.wq

    def tap(self, kh: int, kw: int) -> int:
        """Offset of window tap (kh, kw) in a packed plane, relative to its output position."""
        g = self.g
        y, x = kh * g.dh, kw * g.dw
        return ((y % g.sh * g.sw + x % g.sw) * self.hq + y // g.sh) * self.wq + x // g.sw

    @property
    def workspace(self) -> int:
        """Floats of the shared packed-input buffer (0 when X is read in place or each range packs
        its own rows on its stack)."""
        if self.in_place or self.pack_rows or self.item_stack:
            return 0
        return self.packed_floats

    @property
    def packed_floats(self) -> int:
        """Floats of the whole packed input and the slack its edge tiles read past it: the size of a
        padded X buffer (`x_padded`) too."""
        return self.g.n * self.g.c * self.plane + self._slack(self.tiled_rows)

    @property
    def slab(self) -> bool:
        """Row tiles pack their rows into a small per-thread buffer instead of the whole packed
        image, when that image would not fit in L2 (1 MB; the slab must, too): the packed rows
        then never travel to L3 and back. Halo rows are packed once per tile that reads them."""
        if not self.pack_rows:
            return False
        g = self.g
        per_row = 4 * g.c * g.sw * self.wq
        return per_row * g.sh * self.hq_image > SLAB_MIN_BYTES >= per_row * g.sh * self.hq_slab

    @property
    def stack_floats(self) -> int:
        """Floats of a range's private packed image (or slab): one image's planes and the edge slack."""
        return self.g.c * self.plane + self._slack(self.rh if self.slab else self.tiled_rows)

    @property
    def tiled_rows(self) -> int:
        """Output rows the row tiles cover, the last tile's masked-off rows included."""
        return -(-self.out_h // self.rh) * self.rh

    def _slack(self, rows: int) -> int:
        """Floats past the last plane that the masked-off rows and grid columns of its edge tiles read."""
        g = self.g
        cols = self.w_tiles * self.tile_w  # pixel broadcasts are not masked
        end = max(self.tap(i, j) for i in range(g.kh) for j in range(g.kw)) + (rows - 1) * self.wq + cols
        return max(0, end - self.plane)

    @property
    def shared(self) -> bool:
        """All rows of a tile lie in one group, so they read the same input vectors."""
        return self.g.groups == 1 or self.g.ocg % self.mr == 0

    @property
    def pack_in_item(self) -> bool:
        """Channel blocks hold whole groups (depthwise, grouped convs split by channels), so each block
        packs its own input planes right before using them: no separate pack phase, and they are hot."""
        return not self.in_place and self.par == "oc" and self.g.groups > 1 and (self.ocn * self.mr) % self.g.ocg == 0

    @property
    def item_planes(self) -> int:
        """Input planes one channel block packs: its whole groups, one more where a block may start inside
        a group (tiles narrower than a group)."""
        g = self.g
        return (-(-(self.ocn * self.mr) // g.ocg) + (self.mr % g.ocg != 0)) * g.icg

    @property
    def item_floats(self) -> int:
        """Floats of a block's own packed planes and the slack its edge tiles read past them."""
        return self.item_planes * self.plane + self._slack(self.tiled_rows)

    @property
    def item_stack(self) -> bool:
        """Each channel block packs its planes into one small buffer on its thread's stack, reused block
        after block, instead of the planes' place in a packed image: the buffer stays in L2, where a
        whole-image workspace is cold in a model (other layers evicted it) and every store of the pack
        missed (EfficientNet-B0's 240x28x28 stride-2 depthwise: 3x its time alone)."""
        return self.pack_in_item and 4 * self.item_floats <= ITEM_STACK_BYTES

    @property
    def pack_rows(self) -> bool:
        """Segments are output row tiles: a thread's range packs the input rows it is first to need,
        right before computing them, into a buffer on its own stack: no separate pack phase (one
        barrier less per call at 2+ threads), rows packed by the core that reads them (and, after a
        conv split the same way, wrote them), hot in cache, and no packed line written by two cores
        (a shared buffer's halo rows were rewritten by the next thread while this one read them).
        Each range packs its halo rows itself."""
        return not self.in_place and not self.pack_in_item and self.par == "oh" and not self.flat

    @property
    def tiles(self) -> int:
        return -(-self.g.oc // self.mr)

    @property
    def ic_pad(self) -> int:
        """Input channels per group as laid out in the packed weights."""
        return self.g.icg if self.order == "chw" else -(-self.g.icg // self.icb) * self.icb

    @property
    def panel(self) -> int:
        """Floats of one tile's packed weight panel."""
        return self.ic_pad * self.g.kh * self.g.kw * self.mr

    @property
    def ic_blocks(self) -> int:
        return -(-self.g.icg // self.icb)

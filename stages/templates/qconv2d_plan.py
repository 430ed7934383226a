"""The geometry one `qconv2d` schedule implies: tile counts, the packed input's layout, the workspace.

The input is packed per image and group into channel blocks of 4 (`[cb][ih][phase][wq][4]`
bytes): padded rows `ih`, the padded columns split into `sw` stride phases so that the columns
one output vector reads are consecutive, 4 channels interleaved per column (the 4-byte group a
`vpdpbusd` lane reads). Borders and missing channels hold the activation zero point, so they
add nothing once the bias's `-zx * sum W` is counted. Rows of a phase are `wq` columns: enough for
the last column tile's vectors plus the window's reach, rounded to the pack's 16-column blocks.
"""

from __future__ import annotations

from dataclasses import dataclass

from stages.templates import qgemm_amx
from stages.templates.conv2d_shape import ConvGeom
from stages.templates.qgemm_isa import LANES

PACK_COLS = 16  # columns one pack step writes (64 bytes)


@dataclass(frozen=True)
class QConvSchedule:
    isa: str
    mr: int  # output channels per tile (weights broadcast)
    rh: int  # output rows per tile
    nv: int  # vectors of output columns per tile
    uk: int  # channel-block loop unrolled
    order: str  # "ot_rt": items walk row tiles of one channel tile (weights stay in L1), "rt_ot": the reverse
    axis: str = "w"  # lanes hold output columns (weights broadcast), output channels (pixels broadcast), or
    # "dw": output columns of one depthwise channel, no pack, int32 multiplies (qconv2d_dw)

    @property
    def lanes(self) -> int:
        return LANES[self.isa]

    @classmethod
    def from_knobs(cls, k: dict) -> QConvSchedule:
        return cls(isa=str(k["isa"]), mr=int(k["mr"]), rh=int(k["rh"]), nv=int(k["nv"]), uk=int(k["uk"]),
                   order=str(k["order"]), axis=str(k["axis"]))


@dataclass(frozen=True)
class QConvPlan:
    g: ConvGeom
    s: QConvSchedule

    @property
    def nr(self) -> int:
        return self.s.nv * self.s.lanes

    @property
    def cb(self) -> int:
        """Channel blocks of 4 per group."""
        return -(-self.g.icg // 4)

    @property
    def oc_tile(self) -> int:
        """Output channels per tile: `mr` rows of broadcast weights, `nr` lanes, or one (depthwise)."""
        return {"w": self.s.mr, "oc": self.nr}.get(self.s.axis, 1)

    @property
    def ot(self) -> int:
        """Output-channel tiles per group."""
        return -(-self.g.ocg // self.oc_tile)

    @property
    def rt(self) -> int:
        """Row tiles of `rh` output rows, or (lanes on channels) pixel tiles of `mr` flattened pixels."""
        if self.s.axis == "oc":
            return -(-(self.g.oh * self.g.ow) // self.s.mr)
        return -(-self.g.oh // self.s.rh)

    @property
    def ct(self) -> int:
        return 1 if self.s.axis == "oc" else -(-self.g.ow // self.nr)

    @property
    def hp(self) -> int:
        """Packed rows: the padded rows the windows reach."""
        return (self.g.oh - 1) * self.g.sh + (self.g.kh - 1) * self.g.dh + 1

    @property
    def wq(self) -> int:
        cols = self.ct * self.nr if self.s.axis == "w" else self.g.ow
        reach = cols + (self.g.kw - 1) * self.g.dw // self.g.sw
        return -(-reach // PACK_COLS) * PACK_COLS

    @property
    def plane(self) -> int:
        """Bytes of one channel block."""
        return self.hp * self.g.sw * self.wq * 4

    @property
    def chunks(self) -> int:
        """AMX: tile loads of 16 channel blocks (64 channels) each; the last may reach past the channels."""
        return -(-self.cb // qgemm_amx.ROWS)

    @property
    def workspace(self) -> int:
        if self.s.axis == "dw":
            return 64
        # AMX's last chunk reads whole 16-block tiles: blocks past the end must exist (their weights are 0)
        extra = (self.chunks * qgemm_amx.ROWS - self.cb) * self.plane if self.s.isa == "amx" else 0
        return self.g.n * self.g.groups * self.cb * self.plane + extra

    @property
    def items(self) -> int:
        return self.g.n * self.g.groups * self.ot * self.rt

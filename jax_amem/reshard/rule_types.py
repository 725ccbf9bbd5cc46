"""Rules as data: which regions of which source tensors make each destination tensor.

Three levels, each plain frozen data:

* `Part`: one source tensor as seen by a destination: fixed leading indices
  (a scanned-layer or expert stack unrolled), an axis permutation (a
  transpose), a row-major reshape (head merge `[H, hd, D] -> [H*hd, D]`, head
  split, flatten), a dtype cast, applied in that order, as numpy would:
  `source[index].transpose(transpose).reshape(shape)`, then `* scale + offset`
  (each in the source's dtype, as JAX computes `x * 0.125 + 1` on it; a number, or a
  vector along axis `along` of the part), then `.astype(cast)`. The constants run in the
  copy kernel (affine.py).
  Transposes and casts are applied by the sender to its whole source shard
  before any byte is copied; a reshape costs nothing on the wire (it only
  cuts the part into more pieces).
* `Rule`: a destination tensor made of parts concatenated along `axis`; with
  `groups=g` the axis is cut into g blocks and block j holds slice j of every
  part, in order (vLLM's fused QKV / gate_up per tensor-parallel rank). A part
  with `replicas=k` is cut into g / k slices instead, and block j holds its
  slice j // k: k consecutive blocks hold the same slice (vLLM's KV heads,
  one per rank, when the tensor-parallel size exceeds them).
* `Piece`: the lowered form every rule becomes, and the escape hatch for
  anything rules do not express: one box of the destination filled from one
  box of a (transformed) source.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import RuleError
from .affine import Affine
from .rule_checks import checked_axis, checked_cast, checked_constant, checked_count, checked_name, int_tuple


@dataclass(frozen=True)
class Part:
    src: str
    index: tuple[int, ...] = ()
    transpose: tuple[int, ...] | None = None
    cast: str | None = None
    shape: tuple[int, ...] | None = None  # row-major reshape after index and transpose
    scale: float | tuple[float, ...] | None = None   # multiplies the part (a number or a vector)
    offset: float | tuple[float, ...] | None = None  # added after the scale
    along: int = -1                                  # the part's axis a vector scale / offset runs along
    replicas: int = 1   # in a Rule with groups: consecutive groups that hold the same slice of this part

    def __post_init__(self):
        # Each field in the one form the planner reads, or a refusal naming it (rule_checks.py).
        where = f"part {self.src!r:.60}"
        checked_name(self.src, where, "src")
        fields = {"index": int_tuple(self.index, where, "index", "the leading indices to fix, e.g. index=(layer,)"),
                  "scale": checked_constant(self.scale, where, "scale"),
                  "offset": checked_constant(self.offset, where, "offset"),
                  "along": checked_axis(self.along, where, "along"),
                  "replicas": checked_count(self.replicas, where, "replicas", "a count of groups")}
        if self.transpose is not None:
            fields["transpose"] = int_tuple(self.transpose, where, "transpose", "a permutation of the part's axes")
        if self.shape is not None:
            fields["shape"] = int_tuple(self.shape, where, "shape", "the row-major shape to reshape the part to")
        checked_cast(self.cast, where)
        for name, value in fields.items():
            object.__setattr__(self, name, value)


@dataclass(frozen=True)
class Rule:
    dst: str
    parts: tuple[Part, ...]
    axis: int = 0
    groups: int = 1
    origin: str = field(default="", compare=False)  # the preset / function that wrote it (for errors)

    def __post_init__(self):
        where = f"the rule of {self.dst!r:.60}"
        checked_name(self.dst, where, "dst")
        if isinstance(self.parts, (str, bytes, Part)) or not hasattr(self.parts, "__iter__"):
            raise RuleError(f"{where}: parts={self.parts!r:.80} is not a sequence of Part: give (Part(...), ...)")
        parts = tuple(self.parts)
        bad = [p for p in parts if not isinstance(p, Part)]
        if bad:
            raise RuleError(f"{where}: parts holds {bad[0]!r:.60} ({type(bad[0]).__name__}), not a Part: give "
                            "Part(source name, ...) for each")
        object.__setattr__(self, "parts", parts)
        object.__setattr__(self, "axis", checked_axis(self.axis, where, "axis"))
        object.__setattr__(self, "groups", checked_count(self.groups, where, "groups", "a group count"))

    @classmethod
    def copy(cls, dst: str, src: str | None = None, *, index=(), transpose=None, cast=None,
             shape=None, scale=None, offset=None, along: int = -1) -> "Rule":
        """`dst` is one source tensor (by default the one of the same name), whole."""
        try:
            index, shape = tuple(index), (tuple(shape) if shape is not None else None)
        except TypeError:
            raise RuleError(f"Rule.copy({dst!r}): index={index!r:.80} and shape={shape!r:.80} are tuples of "
                            "ints (shape may be None)") from None
        return cls(dst, (Part(src if src is not None else dst, index, transpose, cast, shape, scale, offset,
                              along),))

    @classmethod
    def concat(cls, dst: str, parts, axis: int = 0, groups: int = 1, origin: str = "") -> "Rule":
        return cls(dst, tuple(parts), axis, groups, origin)


@dataclass(frozen=True)
class Piece:
    """dst[dst_start : dst_start + size] = transformed(src)[src_start : ...].

    `size` has the destination's rank. The source region is `size` aligned to
    the source's trailing axes (extra leading axes on either side have extent 1),
    in the coordinates of the source after `perm` (numpy transpose order) and
    cast to `dtype` (None: no cast). With `affine`, the elements go through its constant
    steps (in source coordinates) and `dtype` is what they are sent in.
    """

    dst: str
    dst_start: tuple[int, ...]
    size: tuple[int, ...]
    src: str
    src_start: tuple[int, ...]
    perm: tuple[int, ...] | None = None
    dtype: str | None = None
    origin: str = field(default="", compare=False)  # the rule / function that made it (for errors)
    affine: Affine | None = None  # constant steps from the source's dtype to `dtype` (affine.py)

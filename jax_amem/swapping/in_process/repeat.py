"""The repeat swap into PyTorch tensors: the swap a training loop makes every step, with the
same tensors and new arrays of the same layouts, costs a fingerprint check and the cached calls.

After a swap into PyTorch tensors the program is kept here with what it was checked against:
- the source tree's structure and each leaf's `aval` and `sharding` (JAX shares these objects
  between the outputs of one jitted function call after call, so comparing the tuples is
  mostly identity checks), and that every leaf is a live `ArrayImpl`;
- the destination's names, the identity of every tensor (weak references: a tensor that dies
  drops the entry, so an id can never stand for a newer tensor), and
  `TorchDestination.fingerprint()`: address, storage offset, storage size and version counter
  per tensor (a moved, freed, shrunk or resized tensor, or one changed by `set_`, misses; the
  swap's own version bump, `before_writing`, is read back after it);
- for every group, which leaves are its operands (positions in the flattened tree).
A swap whose inputs match runs the groups' calls with those leaves, no plan lookup, no
signature hashing, no dictionary of arrays. From the first repeat on, a group's call goes to
its loaded XLA executable directly (`execute_sharded`), skipping jit's per-operand checks (a
few microseconds per operand, most of a swap of thousands of small tensors): the fingerprint
above is exactly what those checks would compare, and the runtime still refuses an operand on
another device. Where this JAX does not expose the executable plainly (constants hoisted as
operands, effects, pruned operands) the group keeps its jitted call. Anything else (a miss, verify, a progress bar, a
source that must be staged on another device first) takes the full path in run.py, which
checks everything and stores a new entry.

Not detected here (the full path refuses these, the repeat writes the old layout): a tensor
re-pointed with `tensor.data = view` at the same address and storage with another shape,
stride or dtype (PyTorch does not count `.data =` as a change). The storage bounds are
checked either way, so no byte outside the tensor's storage is written.
"""

from __future__ import annotations

import operator
import weakref

import jax

from ... import _jax_compat
from ..cache import Lru
from . import torch_copies

_entries = Lru("repeat swaps (in process)")

_aval = operator.attrgetter("aval")
_is_deleted = operator.methodcaller("is_deleted")


def _array_type():
    """The concrete class of jax.Arrays (`jax.Array` itself also admits tracers)."""
    return type(jax.numpy.zeros(()))


_ARRAY = None


class Repeat:
    """A program and the fingerprints of the inputs it was last run with (module docstring)."""

    def __init__(self, program, leaves, names, destination, how):
        self.program = program
        self.avals = tuple(map(_aval, leaves))
        self.read_sharding = _jax_compat.sharding_reader(leaves)  # fast where JAX allows
        self.shardings = tuple(map(self.read_sharding, leaves))
        self.how = how
        values = tuple(destination.torch_tensors.values())
        self.ids = tuple(map(id, values))
        self.alive = [True]
        flag = self.alive

        def died(_ref, flag=flag):
            flag[0] = False

        self._refs = [weakref.ref(t, died) for t in values]  # kept: a dead reference calls `died`
        self.fingerprint = destination.fingerprint()
        position = {name: k for k, name in enumerate(names)}
        self.operands = [operator.itemgetter(*[position[name] for name, _, _ in g.source_refs])
                         for g in program.groups]
        self.singles = [len(g.source_refs) == 1 for g in program.groups]
        self.devices = {g.device for g in program.groups}
        self.calls = None  # per group, execute_sharded or None (the jitted call): made on the first repeat

    def make_calls(self, leaves) -> None:
        """The groups' direct calls, made once per program (Program.direct_calls)."""
        program = self.program
        if program.direct_calls is None:
            program.direct_calls = [None if fn is None else direct_call(fn, (operands(leaves),) if single
                                                                        else operands(leaves))
                                    for fn, operands, single in zip(program.fns, self.operands, self.singles)]
        self.calls = program.direct_calls


def direct_call(fn, shards):
    """The loaded executable's `execute_sharded` behind the jitted `fn` for these operands, or
    None where calling it plainly would skip something jit does (module docstring)."""
    return _jax_compat.direct_call(fn, shards)


def key_of(treedef, names, how) -> tuple:
    return (treedef, names, how)


def _repeats(destination) -> bool:
    """Whether the destination is this process's PyTorch tensors, whose repeats are known by
    identity and fingerprint (by_address.ByAddress.torch_tensors)."""
    return destination.writes_by_address and destination.torch_tensors is not None


def remember(program, sources, destination, how) -> None:
    """Keeps `program` for repeats when every group reads whole single-device sources already
    on its device (no shard selection, no staging); else nothing is kept. `sources`: the
    swap's Sources (the tree as it flattened it)."""
    global _ARRAY
    if not _repeats(destination) or program.route != "addresses":
        return
    for group in program.groups:
        if any(index is not None or device != group.device for _, index, device in group.source_refs):
            return
    leaves = sources.leaves
    if _ARRAY is None:
        _ARRAY = _array_type()
    if any(type(leaf) is not _ARRAY for leaf in leaves):
        return
    _entries.put(key_of(sources.treedef, tuple(destination.torch_tensors), how),
                 Repeat(program, leaves, sources.names, destination, how))


def find(leaves, treedef, destination, how):
    """The remembered Repeat when this swap (its tree flattened: `leaves`, `treedef`) repeats
    one exactly, else None."""
    if _ARRAY is None or not _repeats(destination):
        return None
    tensors = destination.torch_tensors
    entry = _entries.get(key_of(treedef, tuple(tensors), how))
    if entry is None or not entry.alive[0]:
        return None
    try:  # a leaf that is no ArrayImpl (a tracer, a numpy array) lacks one of these
        avals, shardings = tuple(map(_aval, leaves)), tuple(map(entry.read_sharding, leaves))
        if avals != entry.avals or shardings != entry.shardings:
            return None
    except AttributeError:
        return None
    # Equal, but perhaps other objects (a jitted step's outputs after device_put's arrays): keep
    # these, so that the next repeat compares identical objects (no Python __eq__ per leaf).
    entry.avals, entry.shardings = avals, shardings
    if any(map(_is_deleted, leaves)):
        return None  # the full path names what is wrong
    if tuple(map(id, tensors.values())) != entry.ids or destination.fingerprint() != entry.fingerprint:
        return None
    return entry


def run(entry: Repeat, leaves, destination) -> None:
    """The program's calls with the leaves as operands (and the copies PyTorch makes,
    torch_copies.py), then a wait until the device is idle (the destination's
    `before_writing` first, as executor.run does)."""
    from .executor import _wait_quietly

    program = entry.program
    if entry.calls is None and not program.direct:
        entry.make_calls(leaves)
    destination.before_writing(entry.devices)
    # before_writing moved the tensors' version counters on (as copy_ does): the next repeat
    # compares against these (the addresses are as find() read them).
    entry.fingerprint = entry.fingerprint[0], destination.versions()
    if program.direct:  # launched outside XLA (direct.py): the groups' operands, one itemgetter each
        program.direct.run([(get(leaves),) if single else get(leaves)
                            for get, single in zip(entry.operands, entry.singles)], destination)
        return
    outputs = []
    try:
        for group, fn, operands, single, direct in zip(program.groups, program.fns, entry.operands, entry.singles,
                                                       entry.calls):
            shards = operands(leaves)
            if single:
                shards = (shards,)
            if direct is not None:  # one token per chunk, each a list of one per-device array
                for per_device in direct(list(shards)):
                    outputs.extend(per_device)
            elif fn is not None:
                outputs.extend(fn(shards))
            if group.torch_copies:
                torch_copies.run(group, shards, destination.torch_tensors)
    except BaseException:
        _wait_quietly(outputs)  # the calls already dispatched write until they are done
        raise
    finally:
        if program.torch_copies:
            torch_copies.synchronize(program)
    jax.block_until_ready(outputs)

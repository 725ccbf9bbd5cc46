"""The repeat swap into PyTorch tensors: the swap a training loop makes every step, with the
same tensors and new arrays of the same layouts, costs one native pass over its inputs and the
cached calls.

After a swap into PyTorch tensors the program is kept here with what it was checked against,
in a `core.copy.RepeatCheck` (src/bindings/repeat_check.cc), which compares a later swap's
inputs with it in one loop in C:
- the source tree's structure (exact dicts with the same keys, lists and tuples of the same
  length, None: walked without flattening; another tree is flattened and its structure
  compared), each leaf a live `ArrayImpl` with the same `aval` and `sharding` (JAX shares these
  objects between the outputs of one jitted function call after call; equal other objects are
  kept, so the next check compares identities);
- the destination's names in order, the identity of every tensor (weak references: a tensor
  that dies drops the entry, so an identity can never stand for a newer tensor), and per tensor
  `TorchDestination.repeat_readers()`: the layout through PyTorch's DLPack C exchange table and
  the storage size, or, without the table, address, storage offset, storage size and version
  counter (a moved, freed, shrunk or resized tensor, or one changed by `set_`, misses; the
  swap's own version bump, `before_writing`, is read back after it);
- for every group, which leaves are its operands (positions in the flattened tree).
On a hit, for a program launched directly (direct.py), the arrays that are not the last swap's
are awaited in one call and their addresses read into the launch's pointer arrays, in the same
pass: the swap then costs O(1) Python and that one native call, whatever its number of tensors.
Programs that run in XLA get the leaves and call their groups with them, no plan lookup, no
signature hashing. From the first repeat on, a group's call goes to its loaded XLA executable
directly (`execute_sharded`), skipping jit's per-operand checks (a few microseconds per
operand): the check above is exactly what those checks would compare, and the runtime still
refuses an operand on another device. Where this JAX does not expose the executable plainly
(constants hoisted as operands, effects, pruned operands) the group keeps its jitted call.
Anything else (a miss, verify, a progress bar, a source that must be staged on another device
first) takes the full path in run.py, which checks everything and stores a new entry.

The last entry that hit is tried first, on the tree as given; the others by the flattened
tree's structure and the destination's names.

Not detected here (the full path refuses these, the repeat writes the old layout): without the
DLPack table, a tensor re-pointed with `tensor.data = view` at the same address and storage
with another shape, stride or dtype (PyTorch does not count `.data =` as a change); and the
conjugate or negative bit set in place on a tensor already written (`torch._C._set_conj`, `_set_neg`: private calls;
the lazy views `t.conj()` and `torch._neg_view(t)` are other tensors, refused by the full path).
The storage bounds are checked either way, so no byte outside the tensor's storage is written.
"""

from __future__ import annotations

import functools
import operator
import weakref

import jax
import numpy as np

from ... import _jax_compat
from ..._native import core
from ..cache import Lru
from ..sources import flatten
from . import torch_copies

_entries = Lru("repeat swaps (in process)")
_last = Lru("the last repeat swap")  # one entry, under LAST: tried before the tree is flattened
LAST = "last"
_await = _jax_compat.batched_wait()  # one C call that waits for many arrays


class Repeat:
    """A program and the facts of the inputs it was last run with (module docstring)."""

    def __init__(self, program, sources, destination, how):
        self.program = program
        self.how = how
        tensors = destination.torch_tensors
        values = list(tensors.values())
        self.alive = [True]
        flag = self.alive

        def died(_ref, flag=flag):
            flag[0] = False

        self._refs = [weakref.ref(t, died) for t in values]  # kept: a dead reference calls `died`
        position = {name: k for k, name in enumerate(sources.names)}
        operands = [[position[name] for name, _, _ in g.source_refs] for g in program.groups]
        self.operands = [operator.itemgetter(*o) for o in operands]
        self.singles = [len(o) == 1 for o in operands]
        self.devices = {g.device for g in program.groups}
        self.calls = None  # per group, execute_sharded or None (the jitted call): made on the first repeat
        # Per group, its operands' buffer addresses, filled by the check (programs launched directly).
        self.pointers = [np.zeros(len(o), np.int64) for o in operands] if program.direct else None
        leaves = sources.leaves
        readers, rewritten = destination.repeat_readers()
        self.table = core.copy.RepeatCheck(
            tree_spec(sources.tree, leaves), type(leaves[0]), "aval", _jax_compat.sharding_attribute(leaves),
            list(leaves), list(tensors), values, readers, rewritten,
            operands if program.direct else None, self.pointers or [], _await)
        self.walks = self.table.walks

    def make_calls(self, leaves) -> None:
        """The groups' direct calls, made once per program (Program.direct_calls)."""
        program = self.program
        if program.direct_calls is None:
            program.direct_calls = [None if fn is None else direct_call(fn, (operands(leaves),) if single
                                                                        else operands(leaves))
                                    for fn, operands, single in zip(program.fns, self.operands, self.singles)]
        self.calls = program.direct_calls

    def check(self, given, is_tree: bool, tensors):
        """None on a miss; else the leaves (programs run in XLA) or True, the addresses read."""
        if not self.alive[0]:
            return None
        return self.table.check(given, is_tree, tensors, not self.program.direct)


def tree_spec(tree, leaves):
    """The structure of `tree` for RepeatCheck (leaf: its position; dict (0, sorted keys,
    children); list (1, n, children); tuple (2, n, children); None (3,)), or None where the tree
    has other nodes or its walk would not give `leaves` (JAX's flattening) in their order."""
    found = []

    def walk(node):
        kind = type(node)
        if kind is dict:
            keys = tuple(sorted(node))
            return 0, keys, tuple(walk(node[k]) for k in keys)
        if kind is list or kind is tuple:
            return (1 if kind is list else 2), len(node), tuple(map(walk, node))
        if node is None:
            return (3,)
        found.append(node)
        return len(found) - 1

    try:
        spec = walk(tree)
    except (TypeError, RecursionError):  # keys that do not sort, a tree too deep to walk here
        return None
    if len(found) != len(leaves) or any(map(operator.is_not, found, leaves)):
        return None  # a node JAX flattens further (a custom pytree, a namedtuple, ...)
    return spec


def direct_call(fn, shards):
    """The loaded executable's `execute_sharded` behind the jitted `fn` for these operands, or
    None where calling it plainly would skip something jit does (module docstring)."""
    return _jax_compat.direct_call(fn, shards)


def key_of(treedef, tensors, how) -> tuple:
    """The entry's key: the tree's structure, the destination's names and the identities of its
    tensors (two destinations with the same names, swapped in turn, such as one norm replicated
    to every tensor-parallel rank with one plan, each keep their entry), and what selects the
    program. An identity a dead tensor left to a newer one only finds an entry whose check then
    misses (its weak references say the old tensor died)."""
    return (treedef, tuple(tensors), tuple(map(id, tensors.values())), how)


def _repeats(destination) -> bool:
    """Whether the destination is this process's PyTorch tensors, whose repeats are known by
    identity and facts (by_address.ByAddress.torch_tensors)."""
    return destination.writes_by_address and destination.torch_tensors is not None


def remember(program, sources, destination, how) -> None:
    """Keeps `program` for repeats when every group reads whole single-device sources already
    on its device (no shard selection, no staging); else nothing is kept. `sources`: the
    swap's Sources (the tree as it flattened it)."""
    if not _repeats(destination) or program.route != "addresses" or not sources.leaves:
        return
    for group in program.groups:
        if any(index is not None or device != group.device for _, index, device in group.source_refs):
            return
    array = type(sources.leaves[0])
    if array is not _array_type() or any(type(leaf) is not array for leaf in sources.leaves):
        return
    try:
        entry = Repeat(program, sources, destination, how)
    except (TypeError, ValueError, RuntimeError, AttributeError, BufferError):
        return  # a tensor or array whose facts cannot be read (a DLPack export refused: BufferError): no
        # repeat; the swap itself is done
    _entries.put(key_of(sources.treedef, destination.torch_tensors, how), entry)
    _last.put(LAST, entry)


@functools.cache
def _array_type():
    """The concrete class of jax.Arrays (`jax.Array` itself also admits tracers)."""
    return type(jax.numpy.zeros(()))


def find(src_params, destination, how) -> tuple:
    """(the remembered Repeat when this swap repeats one exactly, else None; the leaves, or None
    where the swap is launched directly on a hit; the treedef, or None where the tree was not
    flattened). A miss that flattened the tree hands its leaves and treedef to the full path."""
    if not _repeats(destination):
        return None, None, None
    tensors = destination.torch_tensors
    last = _last.get(LAST)
    if last is not None and last.walks and last.how == how:
        got = last.check(src_params, True, tensors)
        if got is not None:
            return last, (None if got is True else got), None
    leaves, treedef = flatten(src_params, "source tree")
    entry = _entries.get(key_of(treedef, tensors, how))
    if entry is None or entry.check(leaves, False, tensors) is None:
        return None, leaves, treedef
    _last.put(LAST, entry)
    return entry, leaves, treedef


def run(entry: Repeat, leaves, destination) -> None:
    """The program's calls with the leaves as operands (and the copies PyTorch makes,
    torch_copies.py), then a wait until the device is idle (the destination's
    `before_writing` first, or for a direct launch its `before_launch`, as executor.run does)."""
    from .executor import _wait_quietly

    program = entry.program
    if program.direct:  # launched outside XLA (direct.py), with the addresses the check read
        try:
            program.direct.launch(entry.pointers, destination)
        finally:
            # The launch's while_launched moved the tensors' version counters on (as copy_ does):
            # the next repeat compares against these (the addresses are as find() read them).
            entry.table.written()
        return
    if entry.calls is None:
        entry.make_calls(leaves)
    destination.before_writing(entry.devices)
    entry.table.written()  # as above, after before_writing's bump
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

"""The NCCL link's protocol, free of JAX: its store keys, how its ranks meet (the unique id and
every rank's member record), the handshake before each swap, and the receiver's bucket loop.

Two kinds of process run it: a JAX trainer or rollout (`jax_amem.swapping.cross_host`, whose
modules call these functions) and a vLLM worker (`jax_amem_vllm.nccl`), which must not import
JAX nor the `jax_amem` package. So this module imports neither: it reaches the compiled core
through `native.core()`, and raises the error class its link names (`link.Error`: the swap's
`SwapError` in jax_amem, a `LinkError` in the worker). A store's own timeout class passes
through with the awaited message added.

The handshake, per sender->receiver pair and swap `n` (both sides count their swaps with each
peer, so a stale message of an earlier swap is never read as the current one):

1. the sender publishes a header: version, plan key, the packing's digest, bucket size,
   bucket count, payload bytes (`offer`);
2. the receiver compares it with what it computed itself and publishes an ack: ok, or the
   reason it refuses (`answer`); a refusal raises on both sides before any NCCL call, so a
   mismatch never leaves a send waiting on the GPU for a receive that will not come
   (`await_ack` on the sender);
3. after the last bucket is unpacked (and synchronised) the receiver publishes `done`.

What a link must offer these functions: `store` (set / get(key, timeout) / delete, bytes),
`key(*parts)`, `name`, `comm_rank`, `comm`, `timeout`, `sequence` ({peer: swaps done}),
`not_ready()`, `pipe(peer)`, `Error`. Both links (jax_amem's `Link`, the worker's `WorkerLink`)
take their pipes, their close and the meeting's member record and bucket-size check from here
(`Pipes`, `member`, `check_bucket_bytes`).
"""

from __future__ import annotations

import json

PREFIX = "jax_amem/swap"  # the keys' namespace on the wire: both sides must agree on it


class LinkError(RuntimeError):
    """A link refused or failed in a process without jax_amem (the vLLM worker)."""


def key(*parts, error=ValueError) -> str:
    """`jax_amem/swap/a/b/...`; parts must not contain '/' of their own (keeps keys unambiguous)."""
    for part in parts:
        if "/" in str(part) or str(part) == "":
            raise error(f"store key part {part!r} is empty or contains '/': give names without slashes")
    return "/".join([PREFIX, *map(str, parts)])


def _core():
    from .native import core

    return core()


# ----------------------------------------------------------------------------- meeting

def meet(store, prefix: tuple, comm_rank: int, nranks: int, member: dict, timeout: float,
         unique_id: bytes | None = None) -> tuple[bytes, list[dict]]:
    """The link's unique id and every rank's member record, this one's published first. Every
    rank calls it before `init_communicator`; communicator rank 0 passes the id it made
    (`core.transport.unique_id()`), which the others read."""
    if comm_rank == 0:
        store.set(key(*prefix, "id"), unique_id)
    else:
        unique_id = wait(store, key(*prefix, "id"), timeout, "the NCCL unique id from trainer rank 0")
    store.set(key(*prefix, "member", comm_rank), json.dumps(member).encode())
    members = [json.loads(wait(store, key(*prefix, "member", r), timeout, f"communicator rank {r}"))
               for r in range(nranks)]
    return unique_id, members


def member(role: str, rank: int, owner, bucket_bytes: int) -> dict:
    """A rank's member record, as `meet` publishes it: its role, its rank within the role, the
    plan owner (process, device) it stands for and the bucket size it asked for."""
    return {"role": role, "rank": rank, "owner": list(owner), "bucket_bytes": bucket_bytes}


def check_bucket_bytes(name: str, members: list[dict], error) -> None:
    """`error` (the link's class) unless every rank asked for the same bucket size: the two
    ends of a pipe stage buckets of that size, so they must agree before the communicator."""
    sizes = {m["bucket_bytes"] for m in members}
    if len(sizes) != 1:
        raise error(f"link {name!r}: ranks asked for different bucket sizes {sorted(sizes)}: give every "
                    "rank the same bucket_bytes")


def wait(store, name: str, timeout: float, what: str) -> bytes:
    """`store.get`, its timeout (the store's own class, a TimeoutError) naming what was awaited."""
    try:
        return store.get(name, timeout=timeout)
    except TimeoutError as error:
        raise type(error)(f"waiting for {what}: {error}") from None


# ----------------------------------------------------------------------------- the handshake

def header(version: int, plan_key: str, packing) -> dict:
    """`packing`: anything with digest, bucket_bytes, buckets (a sequence) and nbytes."""
    return {"version": int(version), "plan_key": plan_key, "digest": packing.digest,
            "bucket_bytes": packing.bucket_bytes, "buckets": len(packing.buckets),
            "bytes": packing.nbytes}


def mismatch(sent: dict, expected: dict) -> str | None:
    """Why the receiver refuses the sender's header, or None."""
    if "abort" in sent:
        return f"the trainer stopped the swap before sending: {sent['abort']}"
    if sent["version"] != expected["version"]:
        return (f"version mismatch: the trainer sends version {sent['version']}, the rollout expects "
                f"version {expected['version']}; call send and receive with the same version")
    if sent["plan_key"] != expected["plan_key"]:
        return (f"plan mismatch: the trainer planned {sent['plan_key'][:12]}, the rollout "
                f"{expected['plan_key'][:12]}; build both plans from the same layouts and rules")
    if sent["bucket_bytes"] != expected["bucket_bytes"]:
        return (f"bucket size mismatch: trainer {sent['bucket_bytes']} bytes, rollout "
                f"{expected['bucket_bytes']}; connect both with the same bucket_bytes")
    if sent["digest"] != expected["digest"]:
        return ("packing mismatch: both sides hold the same plan key but packed different buckets "
                "(different jax_amem versions?)")
    return None


def pair_key(link, sender: int, receiver: int, n: int, part: str) -> str:
    """The store key of swap `n`'s `part` (header, ack, done) between `sender` and `receiver`."""
    return link.key(f"{sender}-{receiver}", n, part)


def _get(link, name: str, what: str) -> bytes:
    return wait(link.store, name, link.timeout, f"{what} on link {link.name!r}")


def offer(link, receiver: int, n: int, message: dict) -> None:
    """Sender, step 1."""
    link.store.set(pair_key(link, link.comm_rank, receiver, n, "header"), json.dumps(message).encode())


def abort(link, receiver: int, n: int, version: int, reason: str) -> None:
    """Sender: offers swap `n` as stopped, so a receiver waiting for its header refuses at once
    (both sides then count swap n as done) instead of waiting out its timeout."""
    offer(link, receiver, n, {"version": int(version), "abort": reason[:500]})


def await_ack(link, receiver: int, n: int) -> None:
    """Sender: waits for the receiver's answer; `link.Error` carrying its refusal."""
    name = pair_key(link, link.comm_rank, receiver, n, "ack")
    answered = json.loads(_get(link, name, f"rollout rank {receiver}'s answer to swap {n}"))
    if "error" in answered:
        raise link.Error(f"the rollout (communicator rank {receiver}) refused the swap, nothing was sent: "
                         f"{answered['error']}")


def answer(link, sender: int, n: int, expected: dict, refuse: str | None = None) -> dict:
    """Receiver, step 2: reads the header, acks or refuses (and raises). `refuse`: a reason
    of the receiver's own (its communicator is paused) to refuse whatever the header says.
    Returns the header it accepted."""
    sent = json.loads(_get(link, pair_key(link, sender, link.comm_rank, n, "header"),
                           f"trainer rank {sender}'s header of swap {n}"))
    reason = refuse or mismatch(sent, {**expected, "version": sent["version"]} if expected.get("version") is None
                                else expected)
    ack = pair_key(link, sender, link.comm_rank, n, "ack")
    if reason is not None:
        link.store.set(ack, json.dumps({"error": reason}).encode())
        raise link.Error(f"refused the swap from trainer (communicator rank {sender}), nothing was "
                         f"received: {reason}")
    link.store.set(ack, b'{"ok": true}')
    return sent


def mark_done(link, sender: int, n: int, version: int) -> None:
    link.store.set(pair_key(link, sender, link.comm_rank, n, "done"), str(int(version)).encode())


def answer_offers(link, expected: dict) -> dict:
    """Acks (or refuses, raising link.Error) every peer's offer of this swap; `expected`:
    {peer communicator rank: the header this side computed (version None: take the sender's)}.
    Returns {peer: the header accepted}."""
    refuse = link.not_ready()  # refused through the ack, so the trainer never sends into it
    accepted = {}
    for peer, mine in expected.items():
        n = link.sequence.get(peer, 0)
        try:
            accepted[peer] = answer(link, peer, n, mine, refuse)
        except TimeoutError:
            raise  # the trainer never offered swap n: the next call waits for it again
        except link.Error:
            link.sequence[peer] = n + 1  # refused: both sides move past swap n
            raise
        link.sequence[peer] = n + 1
    return accepted


def finish(link, peers, version: int) -> None:
    """After the last bucket landed: the communicator checked, `done` said to every trainer."""
    _core().transport.check_communicator(link.comm)
    for peer in peers:
        mark_done(link, peer, link.sequence[peer] - 1, version)


# ----------------------------------------------------------------------------- a link's pipes

class Pipes:
    """What both ends of a link hold alike: one staging pipe (two buckets) per peer, made on
    first use, and the close that frees them and destroys the communicator. A subclass has
    `name`, `device` (its CUDA ordinal), `bucket_bytes`, `pipes` ({peer: pipe}), `comm` (None
    before it joined) and `Error`."""

    closed = False

    def pipe(self, peer: int) -> int:
        """The staging pipe to/from communicator rank `peer` (two buckets), made on first use."""
        self._require_open()
        if peer not in self.pipes:
            self.pipes[peer] = _core().transport.create_pipe(self.device, self.bucket_bytes)
        return self.pipes[peer]

    def close(self) -> None:
        """Frees the staging pipes and destroys the communicator (collective with the peers); a
        second call does nothing."""
        if self.closed:
            return
        transport = _core().transport
        for pipe in self.pipes.values():
            transport.destroy_pipe(pipe)
        self.pipes.clear()
        if self.comm is not None:
            transport.destroy_communicator(self.comm)
        self.closed = True

    def _require_open(self) -> None:
        if self.closed:
            raise self.Error(f"link {self.name!r} is closed: connect() again")


# ----------------------------------------------------------------------------- receiving

def receive_buckets(link, peer: int, stream: int, buckets) -> None:
    """Enqueues every bucket from communicator rank `peer` on `stream` (a CUDA stream handle),
    then makes the stream wait for the pipe. `buckets`: (nbytes, destination addresses,
    device address of its validated unpack rows, row count) per bucket, in order; bucket k
    lands in the pipe's slot k % 2."""
    transport = _core().transport
    pipe = link.pipe(peer)
    for k, (nbytes, destinations, rows, count) in enumerate(buckets):
        transport.recv_bucket(pipe, stream, k % 2, nbytes, peer, link.comm, list(destinations), rows, count)
    transport.drain(pipe, stream)


# ----------------------------------------------------------------------------- the store

DEFAULT_TIMEOUT = 60.0  # seconds


class StoreTimeout(LinkError, TimeoutError):
    """A key did not appear in the store in time; the message names the key and the store."""


def check_timeout(timeout, error=ValueError) -> float:
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise error(f"timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


class TorchStore:
    """A torch.distributed Store (TCPStore, FileStore, PrefixStore...) in the three calls the
    link uses, values bytes: set(key, value), get(key, timeout) (blocks until the key exists;
    `Timeout` after `timeout` s), delete(key) (no error when absent)."""

    Timeout = StoreTimeout
    Error = ValueError

    def __init__(self, store):
        self.store = store

    @classmethod
    def connect(cls, host: str, port: int, *, is_master: bool = False, timeout: float = DEFAULT_TIMEOUT):
        """A TCPStore client (or the server, `is_master=True`) at host:port."""
        import datetime

        from torch.distributed import TCPStore

        return cls(TCPStore(host, int(port), is_master=is_master, wait_for_workers=False,
                            timeout=datetime.timedelta(seconds=check_timeout(timeout, cls.Error))))

    def set(self, key: str, value: bytes) -> None:
        self.store.set(key, bytes(value))

    def get(self, key: str, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        import datetime

        seconds = check_timeout(timeout, self.Error)
        try:
            self.store.wait([key], datetime.timedelta(seconds=seconds))
        except RuntimeError as error:  # torch's DistStoreError on timeout is a RuntimeError
            if "timeout" not in str(error).lower() and "timed out" not in str(error).lower():
                raise
            raise self.Timeout(f"key {key!r} did not appear in the torch store {self!r} within {seconds:g} s: "
                               "is the other side running, and does it use the same store?") from None
        return bytes(self.store.get(key))

    def delete(self, key: str) -> None:
        self.store.delete_key(key)

    def __repr__(self):
        host = getattr(self.store, "host", None)
        return f"TorchStore({type(self.store).__name__}" + (f" {host}:{self.store.port})" if host else ")")

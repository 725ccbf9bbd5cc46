"""Control messages between a trainer and a rollout, over a key-value store that already
exists: `torch.distributed`'s TCPStore (the rollout's store) or the `jax.distributed`
key-value store (when the trainer runs under `jax.distributed`). No server of our own.

Both are wrapped in the same three calls, values are bytes:

    store.set(key, value)             # overwrites
    store.get(key, timeout=30.0)      # blocks until the key exists; StoreTimeout after `timeout` s
    store.delete(key)                 # no error when absent

Keys are namespaced with `key(...)`: `jax_amem/swap/<part>/<part>/...`.
"""

from __future__ import annotations

from jax_amem_core import wire

from .. import _jax_compat
from .errors import SwapError

PREFIX = wire.PREFIX  # the keys' namespace on the wire, not a module path: both sides must agree on it
DEFAULT_TIMEOUT = 60.0  # seconds


class StoreTimeout(SwapError, TimeoutError):
    """A key did not appear in the store in time; the message names the key and the store."""


def key(*parts) -> str:
    """`jax_amem/swap/a/b/...`; parts must not contain '/' of their own (keeps keys unambiguous).
    The key layout is jax_amem_core.wire's, which a vLLM worker shares without JAX."""
    return wire.key(*parts, error=SwapError)


def _check_timeout(timeout) -> float:
    return wire.check_timeout(timeout, error=SwapError)


class TorchStore(wire.TorchStore):
    """A torch.distributed Store (TCPStore, FileStore, PrefixStore...), e.g. the rollout's
    `TCPStore(host, port, is_master=...)` whose address is given to the trainer. The wrapper
    is jax_amem_core.wire's (a vLLM worker uses it without JAX); here its refusals are
    SwapError and its timeout StoreTimeout."""

    Timeout = StoreTimeout
    Error = SwapError


class JaxStore:
    """The `jax.distributed` key-value store (the coordinator's), for processes that called
    `jax.distributed.initialize`."""

    def __init__(self, client=None):
        if client is None:
            client = _jax_compat.distributed_client()
            if client is None:
                raise SwapError("JaxStore: jax.distributed is not initialized in this process: call "
                                "jax.distributed.initialize(...) first, or use TorchStore over a TCPStore")
        self.client = client

    def set(self, key: str, value: bytes) -> None:
        self.client.key_value_set_bytes(key, bytes(value), allow_overwrite=True)

    def get(self, key: str, timeout: float = DEFAULT_TIMEOUT) -> bytes:
        seconds = _check_timeout(timeout)
        try:
            return bytes(self.client.blocking_key_value_get_bytes(key, int(seconds * 1000)))
        except Exception as error:  # XlaRuntimeError / JaxRuntimeError: DEADLINE_EXCEEDED
            if "DEADLINE_EXCEEDED" not in str(error) and "timed out" not in str(error).lower():
                raise
            raise StoreTimeout(f"key {key!r} did not appear in the jax.distributed key-value store within "
                               f"{seconds:g} s: is the other side running under the same coordinator?") from None

    def delete(self, key: str) -> None:
        self.client.key_value_delete(key)

    def __repr__(self):
        return "JaxStore(jax.distributed)"


def default_store():
    """The jax.distributed store when this process runs under jax.distributed; else SwapError
    asking for a TorchStore."""
    client = _jax_compat.distributed_client()
    if client is not None:
        return JaxStore(client)
    raise SwapError("no store given and jax.distributed is not initialized: pass "
                    "store=TorchStore.connect(host, port) (the rollout's TCPStore)")


def as_store(store):
    """A store as given (anything with set/get/delete), a torch Store wrapped, None -> default."""
    if store is None:
        return default_store()
    if isinstance(store, (TorchStore, JaxStore)):
        return store
    torch_dist = _torch_distributed()
    if torch_dist is not None and isinstance(store, torch_dist.Store):
        return TorchStore(store)
    if all(callable(getattr(store, m, None)) for m in ("set", "get", "delete")):
        return store
    raise SwapError(f"store must be a TorchStore, a JaxStore or a torch.distributed.Store, got "
                    f"{type(store).__name__}")


def _torch_distributed():
    import sys

    if "torch" not in sys.modules:
        return None
    import torch.distributed as dist

    return dist if dist.is_available() else None

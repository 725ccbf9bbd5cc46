"""The jax.distributed key-value store behind jax_amem.swapping.store.JaxStore, for real: a
one-process coordinator on 127.0.0.1 (CPU is enough). Run by tests/test_swap_ipc.py;
prints "RESULT ok" when every check passed."""

import socket

import jax

from jax_amem.swapping.store import JaxStore, StoreTimeout, as_store, key

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=1, process_id=0)

store = as_store(None)  # under jax.distributed: the coordinator's store
assert isinstance(store, JaxStore), store
name = key("rollout", "ready", 0, 1)
store.set(name, b"\x00first")
store.set(name, b"\x00second")  # overwrites
assert store.get(name, timeout=2) == b"\x00second"
store.delete(name)
store.delete(name)  # absent: no error
try:
    store.get(name, timeout=0.3)
except StoreTimeout as error:
    assert "jax_amem/swap/rollout/ready/0/1" in str(error) and "0.3 s" in str(error), error
else:
    raise AssertionError("no timeout")
jax.distributed.shutdown()
print("RESULT ok", flush=True)

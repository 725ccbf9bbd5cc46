"""What a JAX trainer (`jax_amem`) and its rollout workers (`jax_amem_vllm`, inside vLLM) share,
free of JAX: the compiled core and the protocol both sides speak.

    native          the compiled core (`_core`, the nanobind extension), one per process
    wire            the NCCL link's protocol: store keys, the ranks' meeting, the handshake,
                    the receiver's bucket loop, the TorchStore wrapper
    nccl_schedule   what the trainer publishes for an NCCL worker: each rank's record and each
                    group's schedule (buckets, tensors, unpack rows), encoded as bytes
    staging_note    the note a worker writes to say where its staging buffer is
    answers         what the trainer asks every worker through vLLM's collective_rpc
    registry        the worker engines of this process, for a trainer in the same process

The dependency points one way: `jax_amem` and `jax_amem_vllm` import this package, and it imports
neither of them, nor JAX (tests/test_package_layers.py reads every module's imports). Importing it
loads nothing compiled: `native.core()` does, on first use.
"""

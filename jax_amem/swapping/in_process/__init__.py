"""The swap into buffers this process writes itself (PyTorch tensors by address, jax.Arrays by
donation, another process's tensors mapped here through CUDA IPC): run.py resolves the plan
and the compiled program (cached), the executor runs it. Never imports cross_host/.
"""

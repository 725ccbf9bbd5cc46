"""The swap into another process's GPU tensors on this host: ipc.py maps their CUDA IPC
handles (the mapped tensors are a destination the in-process route writes by address),
ready_done.py orders the two sides over a store.
"""

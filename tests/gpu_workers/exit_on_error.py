"""Runs a worker's main so that an exception ends the process at once.

A worker that raised after `jax.distributed.initialize` would otherwise wait at exit in the
distributed service's shutdown for a peer that is itself waiting for it, until run_pair's
timeout: minutes spent on a failure already known.
"""
import os
import sys
import traceback


def run_main(main) -> None:
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)

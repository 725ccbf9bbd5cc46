"""Command line: `python -m jax_amem demo | report | bench`.

demo   the main job on the embedded default (the GPU when present, else 8 XLA CPU devices)
report what this machine offers and what a pause would free (communicators, arrays, pool)
bench  the benchmarks, one table each
"""

from __future__ import annotations

import argparse
import os
import sys


def _default_devices() -> None:
    # Before JAX starts: without a GPU, 8 CPU devices make sharding real.
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")


def cmd_report(args) -> int:
    import jax_amem
    import jax

    from .demo import memory_view

    status = jax_amem.gpu_status()
    print(f"jax-amem {jax_amem.__version__}, jax {jax.__version__}")
    print(f"CUDA kernels built: {status.cuda_kernels_built}")
    print(f"CUDA driver: {'available' if status.driver_available else status.driver_message}")
    print(f"GPUs visible to the driver: {status.device_count}")
    print(f"NCCL interposer: {'active' if jax_amem.nccl.is_installed() else jax_amem.nccl.status()}")
    print(f"JAX devices: {jax.devices()}")
    if not status.usable:
        print(f"no GPU features here ({status.why_not()}): this report can show what a pause would "
              "tag, copy to host and delete, and the NCCL interposer's state; the device memory a "
              "pause frees needs a GPU to measure (docs/benchmarks.md has H200 figures)")
    print("\nthis process: what jax_amem.pause() would free (nothing tagged yet)")
    print(memory_view.would_free())
    if not args.no_example:
        print()
        try:
            print(memory_view.example_cycle())
        except ImportError as error:
            print(f"no example ({error}): it builds the demo's trainer, which needs the `demo` extra "
                  "(pip install 'jax-amem[demo]', or `make demo`)")
    return 0


def cmd_demo(args) -> int:
    from .demo import cli

    return cli.main(args)


def cmd_run(args) -> int:
    from .nccl.launcher import run

    return run(args.argv)


def cmd_bench(_args) -> int:
    from .bench import run_all

    return run_all()


def main(argv=None) -> int:
    _default_devices()
    parser = argparse.ArgumentParser(prog="python -m jax_amem", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    demo_parser = sub.add_parser("demo", help="run the main job: the RL loop (docs/demo.md)")
    from .demo.cli import add_arguments as add_demo_arguments

    add_demo_arguments(demo_parser)
    report_parser = sub.add_parser("report", help="what this machine offers, what a pause would free")
    report_parser.add_argument("--no-example", action="store_true",
                               help="skip pausing an example trainer state (the demo's)")
    sub.add_parser("bench", help="run the benchmarks")
    run_parser = sub.add_parser("run", help="run a program with the NCCL interposer preloaded")
    run_parser.add_argument("argv", nargs=argparse.REMAINDER, help="script.py [args...]")
    args = parser.parse_args(argv)
    handlers = {"demo": cmd_demo, "report": cmd_report, "bench": cmd_bench, "run": cmd_run}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())

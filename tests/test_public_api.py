"""The public API fits on one page (docs/api.md): `jax_amem.__all__` is the verbs and the names a
user types, 18 or fewer; everything else lives under its subpackage, and the page lists every
public name of every subpackage and every error of the one family (jax_amem/errors.py)."""

import importlib
import os
import inspect
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import jax_amem

VERBS = {"pause", "resume", "paused", "is_paused", "reserve", "memory_report", "swap", "plan", "to_torch",
         "nccl", "rules", "gpu_status"}
TYPES = {"Layout", "Owner"}
ERRORS = {"JaxAmemError", "PauseError", "SwapError", "PartialSwapError"}
# Subpackages whose __all__ is public and listed in docs/api.md.
SUBPACKAGES = ["errors", "process_pause", "memory", "nccl", "reshard", "reshard.rules", "swapping",
               "swapping.cross_host", "copy", "platform"]
API_PAGE = Path(__file__).resolve().parent.parent / "docs" / "api.md"


def test_all_is_the_verbs_types_and_errors_and_nothing_else():
    assert len(jax_amem.__all__) == len(set(jax_amem.__all__)), "a name is listed twice"
    assert set(jax_amem.__all__) == VERBS | TYPES | ERRORS
    assert len(jax_amem.__all__) <= 18


def test_every_public_name_resolves_to_what_it_claims_to_be():
    for name in VERBS - {"nccl", "rules"}:
        assert callable(getattr(jax_amem, name)), name
    for name in ("nccl", "rules"):
        assert inspect.ismodule(getattr(jax_amem, name)), name
    for name in TYPES:
        assert inspect.isclass(getattr(jax_amem, name)), name
    for name in ERRORS:
        assert issubclass(getattr(jax_amem, name), jax_amem.JaxAmemError), name
    # `jax_amem.swap` is the verb, not a package.
    assert inspect.isfunction(jax_amem.swap)


def test_star_import_gives_exactly_all():
    namespace = {}
    exec("from jax_amem import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(jax_amem.__all__)


def test_every_subpackage_name_resolves():
    for package in SUBPACKAGES:
        module = importlib.import_module(f"jax_amem.{package}")
        for name in module.__all__:
            assert hasattr(module, name), f"jax_amem.{package}.{name} is in __all__ but missing"


def _page_names() -> set:
    return set(re.findall(r"`([A-Za-z_][A-Za-z_0-9.]*)", API_PAGE.read_text()))


def test_the_api_page_lists_every_public_name():
    listed = {name.rpartition(".")[2] for name in _page_names()} | _page_names()
    missing = sorted(f"jax_amem.{name}" for name in jax_amem.__all__ if name not in listed)
    for package in SUBPACKAGES:
        module = importlib.import_module(f"jax_amem.{package}")
        missing += [f"jax_amem.{package}.{name}" for name in module.__all__ if name not in listed]
    assert not missing, f"docs/api.md does not list: {missing}"


def test_the_api_page_says_which_verb_raises_which_error():
    text = API_PAGE.read_text()
    table = text[text.index("## Errors"):]
    for error in jax_amem.errors.FAMILY:
        assert f"`{error.__name__}`" in table, f"docs/api.md's errors table lacks {error.__name__}"


def test_the_error_family_is_one_hierarchy():
    from jax_amem import errors
    from jax_amem.nccl import NcclNotInstalledError, NcclPauseError
    from jax_amem.reshard import LayoutError, PlanError, RuleError
    from jax_amem.reshard.rules import TraceError
    from jax_amem.swapping import StoreTimeout

    for error in errors.FAMILY + (StoreTimeout,):
        assert issubclass(error, jax_amem.JaxAmemError), error
    # The names users reach through the subpackages are the family's own classes, not copies.
    assert (LayoutError, RuleError, PlanError, TraceError) == (errors.LayoutError, errors.RuleError,
                                                               errors.PlanError, errors.TraceError)
    assert (NcclPauseError, NcclNotInstalledError) == (errors.NcclPauseError, errors.NcclNotInstalledError)
    # Callers that catch ValueError for a refused argument keep working.
    for error in (LayoutError, RuleError, PlanError, TraceError, jax_amem.SwapError):
        assert issubclass(error, ValueError), error
    # pause() documents PauseError; the NCCL part of a pause fails with a member of it.
    assert issubclass(NcclPauseError, jax_amem.PauseError)
    # Refusals that were plain ValueError / TypeError before the family still are.
    assert issubclass(errors.CopyError, ValueError)
    assert issubclass(jax_amem.nccl.NcclArgumentError, NcclPauseError)
    assert issubclass(jax_amem.nccl.NcclArgumentError, ValueError)
    assert issubclass(jax_amem.nccl.NcclArgumentError, TypeError)


def test_primitives_are_reachable_only_under_their_modules():
    from jax_amem.copy import prepare_segments, segment_copy
    from jax_amem.platform import require_gpu

    assert callable(segment_copy) and callable(prepare_segments) and callable(require_gpu)
    for name, home in (("segment_copy", "jax_amem.copy.segment_copy"),
                       ("prepare_segments", "jax_amem.copy.prepare_segments"),
                       ("require_gpu", "jax_amem.platform.require_gpu")):
        with pytest.raises(AttributeError, match=re.escape(f"jax_amem.{name} moved to {home}")):
            getattr(jax_amem, name)
        assert not hasattr(jax_amem, name)


def test_names_that_left_the_top_level_still_resolve_with_a_warning_naming_their_home():
    from jax_amem.process_pause import PauseInfo
    from jax_amem.swapping import SwapReport

    for name, value, home in (("PauseInfo", PauseInfo, "jax_amem.process_pause.PauseInfo"),
                              ("SwapReport", SwapReport, "jax_amem.swapping.SwapReport"),
                              ("GpuUnavailableError", jax_amem.errors.GpuUnavailableError,
                               "jax_amem.errors.GpuUnavailableError")):
        with pytest.warns(DeprecationWarning, match=re.escape(home)):
            assert getattr(jax_amem, name) is value
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
            jax_amem.no_such_name  # noqa: B018


OLD_IMPORTS = ["import jax_amem.swap", "from jax_amem.swap import to_torch", "import jax_amem.swap.ipc",
               "from jax_amem.swap.nccl_transport import connect", "from jax_amem.swap.api import verify"]


def test_the_old_swap_package_says_where_its_modules_went():
    """In a child (no module of the old package cached): each statement's error, one line each."""
    program = "import jax_amem\n" + "".join(
        f"try:\n    {statement}\nexcept Exception as e:\n    print(type(e).__name__, e)\nelse:\n    print('ok')\n"
        for statement in OLD_IMPORTS)
    done = subprocess.run([sys.executable, "-P", "-c", program], capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.strip().splitlines()
    assert len(lines) == len(OLD_IMPORTS), done.stdout
    for statement, line in zip(OLD_IMPORTS, lines):
        assert line.startswith("ModuleNotFoundError No module named 'jax_amem.swap'"), (statement, line)
        for home in ("it is now jax_amem.swapping", "jax_amem.swapping.same_host (ipc",
                     "jax_amem.swapping.cross_host (nccl_transport", "jax_amem.swap is now the verb"):
            assert home in line, (statement, home, line)

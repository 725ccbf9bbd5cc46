"""The JAX_AMEM_* environment variables: one table (docs/configuration.md, jax_amem.settings.VARIABLES),
every name the code mentions in it, every name in it read somewhere, and a bad value refused by
name at import."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jax_amem import settings

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "configuration.md"
NAME = re.compile(r"\bJAX_AMEM_[A-Z0-9_]*[A-Z0-9]\b")
ROW = re.compile(r"^\| `(JAX_AMEM_\w+)` \| .* \| (.+?) \| (.+?) \| (.+?) \|$", re.MULTILINE)

pytestmark = pytest.mark.skipif(not (ROOT / "src").exists(), reason="needs the source tree")


def sources():
    for folder, suffixes in ((ROOT / "jax_amem", (".py",)), (ROOT / "src", (".cc", ".h", ".cu"))):
        for path in sorted(folder.rglob("*")):
            if path.suffix in suffixes:
                yield path


def documented() -> dict[str, tuple[str, str, str]]:
    return {name: (default, values, read_by) for name, default, values, read_by in ROW.findall(DOC.read_text())}


def test_every_variable_the_code_names_is_in_the_table():
    named = {}
    for path in sources():
        for name in NAME.findall(path.read_text()):
            named.setdefault(name, path.relative_to(ROOT).as_posix())
    missing = {name: where for name, where in named.items() if name not in documented()}
    assert not missing, f"named in the code but not in docs/configuration.md: {missing}"


def test_the_table_is_the_settings_table():
    doc = documented()
    runtime = {name: (v.default or "-", v.values, v.read_by) for name, v in settings.VARIABLES.items()}
    assert {name: row for name, row in doc.items() if name in runtime} == runtime
    assert set(doc) == set(runtime) | set(settings.BUILD_VARIABLES)
    assert len(runtime) >= 12


def test_every_variable_in_the_table_is_read_somewhere():
    python = "\n".join(p.read_text() for p in sources() if p.suffix == ".py" and p.name != "settings.py")
    for name, variable in settings.VARIABLES.items():
        if variable.read_by == "jax_amem":
            # A Python read goes through settings.value / settings.flag, with the name or its constant.
            constant = re.search(rf"^(\w+) = \"{name}\"$", python, re.MULTILINE)
            said = [name] + ([constant.group(1)] if constant else [])
            assert any(re.search(rf"settings\.(value|flag)\((\"{s}\"|{s}\b)", python) for s in said), name
        else:
            assert f'std::getenv("{name}")' in (ROOT / variable.read_by).read_text(), name
    for name in settings.BUILD_VARIABLES:
        assert f"$ENV{{{name}}}" in (ROOT / "CMakeLists.txt").read_text(), name


@pytest.mark.parametrize("name, bad", [("JAX_AMEM_NCCL", "no"), ("JAX_AMEM_NCCL_OVERLAP", "grouped"),
                                       ("JAX_AMEM_NCCL_TRIM", "off"), ("JAX_AMEM_PINNED_MEMORY", "cuda"),
                                       ("JAX_AMEM_STAGING_NUMA", "first")])
def test_a_bad_value_stops_the_import_naming_the_variable_and_its_values(name, bad):
    done = subprocess.run([sys.executable, "-P", "-c", "import jax_amem"], capture_output=True, text=True,
                          env={**os.environ, name: bad, "JAX_PLATFORMS": "cpu"}, timeout=300)
    assert done.returncode != 0
    assert f"SettingError: {name}={bad!r} is not understood: give {settings.VARIABLES[name].values}" in done.stderr


def test_values_are_checked_and_defaults_come_from_the_table(monkeypatch):
    monkeypatch.setenv("JAX_AMEM_PINNED_MEMORY", " hostalloc ")
    assert settings.value("JAX_AMEM_PINNED_MEMORY") == "hostalloc"
    monkeypatch.setenv("JAX_AMEM_PINNED_MEMORY", "")
    assert settings.value("JAX_AMEM_PINNED_MEMORY") is None
    monkeypatch.setenv("JAX_AMEM_CONFIGURE_ALLOCATOR", "Off")
    assert settings.flag("JAX_AMEM_CONFIGURE_ALLOCATOR", True) is False
    monkeypatch.setenv("JAX_AMEM_NCCL_TRIM", "0")
    settings.check_all()
    monkeypatch.setenv("JAX_AMEM_NCCL_IDS", "ring")
    with pytest.raises(settings.SettingError, match="JAX_AMEM_NCCL_IDS='ring' is not understood: give agreement "
                                                    "or communicator, or unset it"):
        settings.check_all()
    with pytest.raises(KeyError, match="JAX_AMEM_NO_SUCH is not one of jax_amem's variables"):
        settings.value("JAX_AMEM_NO_SUCH")

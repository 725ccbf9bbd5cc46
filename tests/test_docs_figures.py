"""Every figure README.md's figures table and docs/limits.md quote is the one in docs/figures/figures.json.

The JSON holds each headline figure once (its values with units, the machine, the version, the
command and the docs/benchmarks.md section that explains it). The docs mark each value they
quote with its id, `<!--fig:ID.KEY-->` right before the value as the JSON formats it
(`<!--fig:swap_small_repeat.ms-->1.50-1.57 ms`), or `<!--fig:ID-->not measured` for a figure
not measured yet. A number with a unit of time, rate or ratio (ms, us, s, GB/s, x, %) left
unmarked there is refused, unless it is a goal. Plain Python: no JAX, no GPU.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIGURES = REPO / "docs" / "figures" / "figures.json"
README = REPO / "README.md"
LIMITS = REPO / "docs" / "limits.md"
BENCHMARKS = REPO / "docs" / "benchmarks.md"

MARKER = re.compile(r"<!--\s*fig:(\w+)(?:\.(\w+))?\s*-->")
# A measured quantity: a number or a range, then a unit of time, rate or ratio.
QUANTITY = re.compile(r"(?<![\w.+-])[+-]?\d+(?:\.\d+)?(?:[-–]\d+(?:\.\d+)?)?(?:x|%|\s?(?:ms|us|s|GB/s))(?![\w/])")
UNITS = {"ms", "us", "s", "GB/s", "x", "%", "MiB"}
REQUIRED = {"what", "machine", "version", "command", "section", "values"}
NOT_MEASURED = "not measured"


def load() -> dict:
    return json.loads(FIGURES.read_text())


def number(value: float, decimals: int) -> str:
    return f"{value:.{decimals}f}"


def formatted(spec: dict) -> str:
    """A value as the docs quote it: `1.50-1.57 ms`, `1.08x`, `93-96%`, `+110 MiB` is `110 MiB`."""
    value, decimals, unit = spec["value"], spec.get("decimals", 2), spec["unit"]
    text = "-".join(number(v, decimals) for v in value) if isinstance(value, list) else number(value, decimals)
    return text + unit if unit in ("x", "%") else f"{text} {unit}"


def slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not line.startswith("#"):
            continue
        base = slug(line.lstrip("#"))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def section_exists(section: str) -> bool:
    path, _, anchor = section.partition("#")
    return (REPO / path).is_file() and anchor in anchors(REPO / path)


def figures_section(readme: str) -> str:
    """README's "## Figures" section."""
    start = readme.index("\n## Figures\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end >= 0 else len(readme)]


def problems(text: str, name: str, figures: dict) -> list[str]:
    """What in `text` (a doc's quoted part) differs from the figures, or is quoted unmarked."""
    found = []
    for m in MARKER.finditer(text):
        fid, key = m.group(1), m.group(2)
        after = text[m.end():]
        figure = figures.get(fid)
        if figure is None:
            found.append(f"{name}: no figure {fid!r} in {FIGURES.name}")
            continue
        if key is None:
            if figure.get("measured", True) or not after.startswith(NOT_MEASURED):
                found.append(f"{name}: {fid} is marked without a value: only a figure not measured is, as '{NOT_MEASURED}'")
            continue
        spec = figure["values"].get(key)
        if spec is None:
            found.append(f"{name}: figure {fid} has no value {key!r}")
        elif not after.startswith(formatted(spec)):
            found.append(f"{name}: {fid}.{key} quoted as {after[:len(formatted(spec)) + 6]!r}, "
                         f"{FIGURES.name} has {formatted(spec)!r}")
    found += [f"{name}: unmarked figure {q!r} in ...{context}..." for q, context in unmarked(text, figures)]
    return found


def unmarked(text: str, figures: dict) -> list[tuple[str, str]]:
    """Quantities not right after a marker, and no goal."""
    marked = set()
    for m in MARKER.finditer(text):
        fid, key = m.group(1), m.group(2)
        spec = figures.get(fid, {}).get("values", {}).get(key) if key else None
        if spec is not None and text[m.end():].startswith(formatted(spec)):
            marked.add(m.end())
    out = []
    for q in QUANTITY.finditer(text):
        if q.start() in marked:
            continue
        before, after = text[max(0, q.start() - 16):q.start()].lower(), text[q.end():q.end() + 8].lower()
        if "goal" in before or after.startswith((" goal", "goal")):
            continue
        out.append((q.group(0), text[max(0, q.start() - 30):q.end() + 10].replace("\n", " ")))
    return out


@pytest.fixture(scope="module")
def figures() -> dict:
    return load()["figures"]


@pytest.fixture(scope="module")
def quoted() -> dict[str, str]:
    return {"README.md (Figures)": figures_section(README.read_text()), "docs/limits.md": LIMITS.read_text()}


def test_every_figure_is_complete_and_its_section_exists(figures):
    machines = load()["machines"]
    for fid, figure in figures.items():
        assert REQUIRED <= set(figure), (fid, REQUIRED - set(figure))
        assert figure["machine"] in machines, (fid, figure["machine"])
        assert section_exists(figure["section"]), (fid, figure["section"])
        assert figure["values"] or figure.get("measured") is False, fid
        for key, spec in figure["values"].items():
            assert spec["unit"] in UNITS, (fid, key, spec["unit"])
            value = spec["value"]
            assert isinstance(value, (int, float)) or (len(value) == 2 and value[0] < value[1]), (fid, key)
        for side in ("baseline", "ceiling", "measured"):
            if isinstance(figure.get(side), dict):
                assert {"what", "value", "unit"} <= set(figure[side]), (fid, side)


def test_every_quoted_figure_is_the_one_in_the_figures_file(figures, quoted):
    found = []
    for name, text in quoted.items():
        found += problems(text, name, figures)
    assert found == []


def test_every_figure_and_value_is_quoted(figures, quoted):
    used = {(m.group(1), m.group(2)) for text in quoted.values() for m in MARKER.finditer(text)}
    missing = [f"{fid}.{key}" for fid, figure in figures.items() for key in figure["values"]
               if (fid, key) not in used]
    missing += [fid for fid, figure in figures.items() if not figure["values"] and (fid, None) not in used]
    assert missing == []


def test_the_readme_table_has_one_row_a_figure_with_its_machine_and_section(figures):
    rows = [line for line in figures_section(README.read_text()).splitlines()
            if line.startswith("|") and not line.startswith("|---") and "<!--fig:" in line]
    assert rows, "README's figures table has no marked rows"
    ids = []
    for row in rows:
        row_ids = {m.group(1) for m in MARKER.finditer(row)}
        assert len(row_ids) == 1, row
        fid = row_ids.pop()
        ids.append(fid)
        figure = figures[fid]
        link = re.search(r"\]\(([^)#]+#[^)]+)\)", row)
        assert link and link.group(1) == figure["section"], (fid, link and link.group(1), figure["section"])
        measured_on = row.rstrip(" |").rsplit("|", 1)[1]
        assert figure["machine"] in measured_on and figure["version"] in measured_on, (fid, measured_on)
    assert len(ids) == len(set(ids)), "a figure has two rows"
    table = figures_section(README.read_text())
    header = [line for line in table.splitlines() if line.startswith("| what")]
    body = [line for line in table.splitlines() if line.startswith("|") and not line.startswith(("|---", "| what"))]
    assert header and len(body) == len(rows), "every row of the table is a marked figure"


def test_a_changed_or_unmarked_number_is_caught(figures, quoted):
    """The checks above can fail: a quoted value changed by one digit, and a figure quoted
    without its mark, are both reported."""
    readme = quoted["README.md (Figures)"]
    m = next(MARKER.finditer(readme))
    spec = figures[m.group(1)]["values"][m.group(2)]
    shown = formatted(spec)
    changed = readme[:m.end()] + shown.replace(shown[0], str((int(shown[0]) + 1) % 10), 1) + readme[m.end() + len(shown):]
    assert problems(readme, "README", figures) == []
    assert any("quoted as" in p for p in problems(changed, "README", figures))
    assert any("unmarked" in p for p in problems(readme + "\nthe swap takes 3.3 ms\n", "README", figures))
    assert not problems("the goal is 1 ms; goal 70%; (goal 1.05x)", "limits", figures)


def test_every_link_to_a_docs_section_resolves():
    """Links with an anchor between README.md and docs/*.md point at a heading that exists."""
    gone = []
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([\w./-]+\.md)#([\w-]+)\)", doc.read_text()):
            path = (doc.parent / target) if (doc.parent / target).is_file() else REPO / target
            if not path.is_file() or anchor not in anchors(path):
                gone.append(f"{doc.relative_to(REPO)}: {target}#{anchor}")
    assert gone == []


def test_the_version_is_one_in_pyproject_the_package_and_the_changelog():
    """pyproject.toml and jax_amem.__version__ name the released version; the changelog's first
    heading is the version in development, its second the released one."""
    released = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    package = re.search(r'^__version__ = "([^"]+)"', (REPO / "jax_amem" / "__init__.py").read_text(), re.M)
    assert package and package.group(1) == released
    headings = re.findall(r"^## (\S+)(.*)$", (REPO / "docs" / "changelog.md").read_text(), re.M)
    (upcoming, note), (last, _) = headings[0], headings[1]
    assert note.strip() == "(in development)" and last == released
    as_tuple = lambda v: tuple(int(p) for p in v.split(".")[:3])  # noqa: E731
    assert as_tuple(upcoming) > as_tuple(released)
    for doc in (LIMITS, BENCHMARKS):
        assert f"{upcoming} (in development)" in doc.read_text(), doc.name

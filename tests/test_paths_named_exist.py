"""Every file of this repository that the docs, comments or strings name exists.

A token that looks like a path to a source or doc file (a known extension: .py, .cc, .h, .cu,
.md, .sh, .toml, ...) must be a file or folder of the repository, resolved against the
repository root or against the folder of the file that names it; a bare file name, or a path
given from inside a package (`cross_host/send.py`), must be the end of some file's path; a glob
(`nccl_*_bucket.cc`) must match one. Files of other projects (NCCL's, XLA's, CUDA's headers) and
placeholders in usage lines (`script.py`) are listed below by name."""

from __future__ import annotations

import fnmatch
import os
import re
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]

# Where names are read: the docs, the sources, the tests and the build files.
SCANNED = ["README.md", "docs", "jax_amem", "jax_amem_core", "jax_amem_vllm", "src", "tests", "benchmarks", "scripts", "notebooks", "ci", ".ci",
           "Makefile", "CMakeLists.txt", "pyproject.toml"]
TEXT_SUFFIXES = {".md", ".py", ".cc", ".h", ".cu", ".sh", ".inc", ".ipynb", ".toml", ".txt", ".map", ".c"}
SKIPPED_DIRS = {"__pycache__", ".ipynb_checkpoints", "figures"}
EXTENSIONLESS = {"run", "Makefile"}

EXTENSIONS = "py|cc|h|cu|md|sh|toml|ipynb|inc|cmake"
# A path-like token: not inside a longer word, path, attribute chain or template ("{}", "$OUT/",
# "<cuda.h>", "~/"), and not followed by more of one (`transformer.h.{i}`, `segment_copy.cc.o`).
PATH_TOKEN = re.compile(r"(?<![\w./\-{}<>$*~@:])((?:\.\.?/)*[\w*-][\w.*-]*(?:/[\w.*-]+)*\.(?:"
                        + EXTENSIONS + r"))(?!\.?[\w/{-])")

# Named on purpose and not ours: other projects' files, and placeholders in usage lines.
NOT_OURS = {
    "cuda.h": "the CUDA driver API's header",
    "nccl.h": "NCCL's header",
    "dlpack.h": "DLPack's header (DLTensor, the C exchange table)",
    "cuda_runtime.h": "the CUDA runtime API's header",
    "src/mem_manager.cc": "NCCL's source (where ncclCommSuspend checks the memory manager's refcount)",
    "script.py": "a placeholder: python -m jax_amem run script.py",
    "program.py": "a placeholder: a test writes a program of that name into tmp_path",
    "hf_shape.py": "MaxText's checkpoint conversion (the tables of Hugging Face shapes)",
    "conversion_mapping.py": "transformers' load-time conversion of per-expert tensors",
}
NOT_OURS_PREFIXES = ("xla/", "vllm/", "model_loader/", "nccl/src/", "src/maxtext/", "transformers/", "src/transformers/")


def scanned_files(repo: Path = REPO) -> list[Path]:
    out = []
    for name in SCANNED:
        top = repo / name
        if top.is_file():
            out.append(top)
        elif top.is_dir():
            for folder, dirs, files in os.walk(top):
                dirs[:] = sorted(d for d in dirs if d not in SKIPPED_DIRS and not d.startswith("."))
                out += [Path(folder, f) for f in sorted(files)
                        if Path(f).suffix in TEXT_SUFFIXES or f in EXTENSIONLESS]
    this = Path(__file__).resolve()  # its own examples of gone names are on purpose
    return [path for path in out if path.resolve() != this]


def repo_paths(repo: Path = REPO) -> set[str]:
    """Every file and folder under the scanned roots, as paths from the repository root."""
    paths = set()
    for path in scanned_files(repo):
        relative = PurePosixPath(path.relative_to(repo).as_posix())
        paths.add(str(relative))
        paths.update(str(parent) for parent in relative.parents if str(parent) != ".")
    return paths


def normalised(path: PurePosixPath) -> str | None:
    parts: list[str] = []
    for part in path.parts:
        if part == "..":
            if not parts:
                return None
            parts.pop()
        elif part != ".":
            parts.append(part)
    return "/".join(parts)


def exists(token: str, named_in: str, paths: set[str]) -> bool:
    """Whether `token`, named in the file `named_in` (a path from the root), is in `paths`."""
    if token in NOT_OURS or token.startswith(NOT_OURS_PREFIXES):
        return True
    if "*" in token:
        return any(fnmatch.fnmatch(p, token) or fnmatch.fnmatch(p, "*/" + token) for p in paths)
    for base in (PurePosixPath(), PurePosixPath(named_in).parent):
        if normalised(base / token) in paths:
            return True
    bare = token.lstrip("./")
    return not token.startswith("..") and any(p.endswith("/" + bare) for p in paths)


def dangling(text: str, named_in: str, paths: set[str]) -> list[str]:
    found = []
    for match in PATH_TOKEN.finditer(text):
        if not exists(match.group(1), named_in, paths):
            line = text.count("\n", 0, match.start()) + 1
            found.append(f"{named_in}:{line}: {match.group(1)}")
    return found


PATHS = repo_paths()


def test_the_finder_catches_names_of_files_that_do_not_exist():
    """The oracle of the test below: names of files that were gone are caught, real ones are
    not, and dotted attribute chains or build outputs are no paths."""
    gone = ["called from Python (jax_amem/nccl/_interposer.py) through ctypes",
            "Measured on an H200 (docs/pause.md, FACTS.md): XLA's default allocator",
            "the custom call (`src/ffi/nccl_send_bucket_cuda.cc` over `src/transport/bucket_pipe.cu`)",
            "the receiver's per-bucket call (the sender's runs inside XLA, see src/ffi/nccl_send_bucket.h).",
            "see ../../docs/nowhere.md", "in `nccl_*_bucket_cuda.cc`"]
    for text in gone:
        assert dangling(text, "src/bindings/transport.cc", PATHS), text
    real = ["see src/ffi/nccl_send_bucket.cc and host_blocks.h.", "(`cross_host/receive_torch.py`)",
            "`src/ffi/nccl_*_bucket.cc`", "see ../memory/staging_pool.h", "docs/pause.md, docs/swap.md.",
            "prefix = 'transformer.h.{}.'", "Building CXX object src/copy/CMakeFiles/x.dir/segment_copy.cc.o",
            "#include <cuda.h>", '#include "xla/ffi/api/ffi.h"', "NCCL's src/mem_manager.cc",
            "out to $OUT/notes.md"]
    for text in real:
        assert not dangling(text, "src/nccl/control_api.cc", PATHS), text
    assert dangling("docs/demo.md names `../rollout.py`", "docs/demo.md", PATHS)


@pytest.mark.parametrize("root", [r for r in SCANNED if (REPO / r).exists()])
def test_every_file_the_repository_names_exists(root):
    named = [p for p in scanned_files() if p.relative_to(REPO).parts[0] == root]
    assert named or (REPO / root).is_file(), root
    gone = []
    for path in named:
        gone += dangling(path.read_text(errors="replace"), path.relative_to(REPO).as_posix(), PATHS)
    assert gone == []

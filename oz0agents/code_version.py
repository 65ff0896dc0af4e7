"""The version of an agent's code: a digest of the files the installer lets its harness run
(`oz0agents.harness_programs` decides which). A manifest names its code; the code can change under
the same manifest, so the digest is recorded three times: on the version when it is registered,
on each run when it is created, and on each harnessed round when it starts (the worker loads the
code then). A run whose digest differs from its version's ran changed code (the run page says so
and the scorecard counts runs per digest).

Which files:
- a program (`jsonl`, `acp`): the files its argv names as the installer lists it now, each argument
  resolved as the worker resolves it (`harness_programs.program_argv`); the interpreter a bare first word
  names (`python`, `node`) is the platform's, not the agent's code. A folder named counts its files.
- an import target (`pydantic_ai`, `openai_agents`): the module's own file, or every file of its
  package when the module is a package, found as the bridge finds it (the folders of
  OZ0_AGENT_PATH first, then the installed packages), never imported. What it imports from other
  modules is not covered.

Nothing here imports or runs the code: the web process registers versions and creates runs.
The digest is "" when the agent has no code of its own (oz0's own loop) or none can be found.
"""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from django.conf import settings

from oz0agents import harness_programs
from oz0agents.harness_programs import ProgramsFileError, program_argv

# A package of more files than this is hashed by its first files in path order: a digest that
# costs a run's creation seconds would be worse than one that misses a far file of a huge tree.
FILES_MAX = 2000
FILE_BYTES_MAX = 64 * 1024 * 1024
SKIPPED_FOLDERS = frozenset({"__pycache__", ".git", ".mypy_cache", ".pytest_cache", ".ruff_cache", "node_modules"})
SKIPPED_SUFFIXES = (".pyc", ".pyo")

# File contents' digests by (path, mtime, size): a run's creation stats its code, it does not reread it.
_file_digests: dict[tuple[str, int, int], str] = {}


def code_digest(manifest: Mapping[str, Any] | None) -> str:
    """The digest of the code the manifest's harness runs now, or "" (see the module's doc)."""
    harness = (manifest or {}).get("harness")
    if not isinstance(harness, Mapping):
        return ""
    files = list(code_files(harness))
    if not files:
        return ""
    whole = hashlib.sha256()
    for label, path in sorted(files)[:FILES_MAX]:
        content = _file_digest(path)
        if content is not None:
            whole.update(f"{label}\0{content}\n".encode())
    return whole.hexdigest()


def code_files(harness: Mapping[str, Any]) -> Iterator[tuple[str, Path]]:
    """(label, path) of each file of the harness's code; the label names it the same way wherever
    the install lives, so only a change of the files changes the digest."""
    kind = harness.get("kind")
    if kind in ("jsonl", "acp"):
        yield from _program_files(harness.get("program"))
    elif kind in ("pydantic_ai", "openai_agents"):
        yield from _module_files(str(harness.get("target") or ""))


def _program_files(name: Any) -> Iterator[tuple[str, Path]]:
    if not isinstance(name, str):
        return
    try:
        found = harness_programs.program(name)
    except ProgramsFileError:
        return
    if found is None:
        return
    for index, (written, resolved) in enumerate(zip(found.argv, program_argv(found.argv), strict=True)):
        if index == 0 and "/" not in written:
            continue  # a command on PATH (`python`): the platform's interpreter, not the agent's code
        path = Path(resolved)
        if path.is_file():
            yield f"argv[{index}]:{written}", path
        elif path.is_dir():
            yield from ((f"argv[{index}]:{written}/{label}", file) for label, file in _folder_files(path))


def _module_files(target: str) -> Iterator[tuple[str, Path]]:
    module = target.partition(":")[0]
    if not module or not harness_programs.module_allowed(module):
        return
    parts = module.split(".")
    for root in _search_roots():
        package = root.joinpath(*parts)
        if (package / "__init__.py").is_file():
            yield from ((f"{module}/{label}", file) for label, file in _folder_files(package))
            return
        single = package.with_suffix(".py")
        if single.is_file():
            yield f"{module}.py", single
            return


def _search_roots() -> list[Path]:
    """Where the bridge finds a module: OZ0_AGENT_PATH's folders, then the interpreter's path
    without oz0's own folders (the bridge takes them off its path)."""
    install = Path(settings.BASE_DIR).resolve()
    harness = install / "runs" / "worker" / "harness"
    roots = [p for p in harness_programs.agent_path() if p.is_dir()]
    for entry in sys.path:
        folder = Path(entry or ".").resolve()
        if folder.is_dir() and folder not in (install, harness) and folder not in roots:
            roots.append(folder)
    return roots


def _folder_files(folder: Path) -> Iterable[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    for current, folders, names in os.walk(folder):
        folders[:] = sorted(f for f in folders if f not in SKIPPED_FOLDERS and not f.startswith("."))
        for name in sorted(names):
            if name.endswith(SKIPPED_SUFFIXES):
                continue
            path = Path(current) / name
            found.append((path.relative_to(folder).as_posix(), path))
            if len(found) >= FILES_MAX:
                return found
    return found


def _file_digest(path: Path) -> str | None:
    try:
        stat = path.stat()
        key = (str(path), stat.st_mtime_ns, stat.st_size)
        if key in _file_digests:
            return _file_digests[key]
        if stat.st_size > FILE_BYTES_MAX:
            digest = f"size:{stat.st_size}:mtime:{stat.st_mtime_ns}"
        else:
            with path.open("rb") as stream:
                digest = hashlib.file_digest(stream, "sha256").hexdigest()
    except OSError:
        return None
    if len(_file_digests) > 10000:
        _file_digests.clear()
    _file_digests[key] = digest
    return digest

"""What code the installer lets agents written in frameworks run (F7). A workspace's manifest only
names it; nothing here imports or runs anything (lint reads it in the web process).

- Programs (the `jsonl` and `acp` harnesses): the YAML file `OZ0_HARNESS_PROGRAMS` maps a name to
  its argv, `triage: [python, oz0agents/examples/jsonl_agent.py]`, or to `{argv: [...], env: {NAME:
  value}}` (the environment the installer gives that program: the place for its credentials). The
  shipped examples' programs are allowed besides while `OZ0_HARNESS_EXAMPLES` is on.
- Import targets (the `pydantic_ai` and `openai_agents` harnesses): `package.module:attribute`,
  whose module must lie under a prefix of `OZ0_HARNESS_MODULES` (`acme.agents` allows
  `acme.agents` and `acme.agents.triage`, not `acme.agentsmith`), or be one of the examples' modules
  while `OZ0_HARNESS_EXAMPLES` is on. They are found among the installed packages and the folders of
  `OZ0_AGENT_PATH` (and oz0agents/examples/ with the examples).

The worker reads the same lists when it starts a harness, so a program the installer changes or
removes takes effect at the agent's next round, and a version registered under an older list is
refused if the list no longer allows it.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from django.conf import settings

PROGRAM_NAME = re.compile(r"^[a-z][a-z0-9_.-]{0,99}$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
ARGV_MAX = 64
ARGUMENT_MAX = 4096
PROGRAMS_FILE_MAX = 1024 * 1024
EXAMPLES_DIR = Path(settings.BASE_DIR) / "oz0agents" / "examples"
# The examples' programs (oz0agents/examples/*.yaml name them) and the modules their import targets
# name (found in oz0agents/examples/, which the harness then puts on its path).
EXAMPLE_PROGRAMS: dict[str, tuple[str, ...]] = {
    "jsonl-example": ("python", "oz0agents/examples/jsonl_agent.py"),
    "acp-example": ("python", "oz0agents/examples/acp_agent.py"),
}
EXAMPLE_MODULES = ("pydantic_triage", "openai_triage")
# Variables a manifest's `env:` may not set: the sandbox's own, and those that make a program's
# runtime load other code (a workspace could otherwise turn an allowed program into another one).
RESERVED_ENV = frozenset(
    {
        "PATH",
        "HOME",
        "TMPDIR",
        "PWD",
        "SHELL",
        "USER",
        "LOGNAME",
        "ENV",
        "BASH_ENV",
        "NODE_OPTIONS",
        "NODE_PATH",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYLIB",
        "RUBYOPT",
        "JAVA_TOOL_OPTIONS",
        "_JAVA_OPTIONS",
        "GCONV_PATH",
        "OZ0_AGENT_PATH",
    }
)
RESERVED_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON", "OZ0_HARNESS")


class ProgramsFileError(Exception):
    """The installer's programs file cannot be read; the message names the setting and the problem."""


@dataclass(frozen=True)
class Program:
    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def reserved_env(name: str) -> bool:
    return name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES)


def programs() -> dict[str, Program]:
    """Every program a harness may name now: the examples' (when allowed), then the file's."""
    found: dict[str, Program] = {}
    if settings.OZ0_HARNESS_EXAMPLES:
        found.update({name: Program(name, argv) for name, argv in EXAMPLE_PROGRAMS.items()})
    found.update(_programs_file(str(settings.OZ0_HARNESS_PROGRAMS or "")))
    return found


def program(name: str) -> Program | None:
    return programs().get(name)


def module_prefixes() -> list[str]:
    prefixes = [str(p) for p in settings.OZ0_HARNESS_MODULES]
    if settings.OZ0_HARNESS_EXAMPLES:
        prefixes.extend(EXAMPLE_MODULES)
    return prefixes


def module_allowed(module: str) -> bool:
    return any(module == prefix or module.startswith(prefix + ".") for prefix in module_prefixes())


def agent_path() -> list[Path]:
    """The folders an import target is looked for in, besides the installed packages."""
    folders = [Path(p) for p in settings.OZ0_AGENT_PATH]
    if settings.OZ0_HARNESS_EXAMPLES:
        folders.append(EXAMPLES_DIR)
    return folders


_cache: dict[tuple[str, int, int], dict[str, Program]] = {}


def _programs_file(path: str) -> dict[str, Program]:
    if not path:
        return {}
    where = f"OZ0_HARNESS_PROGRAMS ({path})"
    try:
        stat = Path(path).stat()
        key = (path, stat.st_mtime_ns, stat.st_size)
        if key in _cache:
            return _cache[key]
        if stat.st_size > PROGRAMS_FILE_MAX:
            raise ProgramsFileError(f"{where} is larger than {PROGRAMS_FILE_MAX:,} bytes")
        text = Path(path).read_text(encoding="utf-8")
    except OSError as error:
        raise ProgramsFileError(f"{where} cannot be read: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise ProgramsFileError(f"{where} is not UTF-8 text") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ProgramsFileError(f"{where} is not YAML: {error}".splitlines()[0]) from None
    parsed = _parse(data or {}, where)
    _cache.clear()
    _cache[key] = parsed
    return parsed


def _parse(data: Any, where: str) -> dict[str, Program]:
    if not isinstance(data, Mapping):
        raise ProgramsFileError(f"{where} must map program names to [program, arguments...] or {{argv, env}}")
    found: dict[str, Program] = {}
    for name, value in data.items():
        if not isinstance(name, str) or not PROGRAM_NAME.match(name):
            raise ProgramsFileError(f"{where}: {name!r} is not a program name (lowercase letters, digits, `_.-`)")
        entry = value if isinstance(value, Mapping) else {"argv": value}
        unknown = set(entry) - {"argv", "env"}
        if unknown:
            raise ProgramsFileError(f"{where}: {name} has unknown field(s) {', '.join(sorted(map(str, unknown)))}")
        argv = entry.get("argv")
        if (
            not isinstance(argv, list)
            or not 0 < len(argv) <= ARGV_MAX
            or not all(isinstance(a, str) and a and len(a) <= ARGUMENT_MAX and "\x00" not in a for a in argv)
        ):
            raise ProgramsFileError(f"{where}: {name} must be a list of 1 to {ARGV_MAX} strings: the program, then its arguments")
        env = entry.get("env") or {}
        if not isinstance(env, Mapping) or not all(
            isinstance(k, str) and ENV_NAME.match(k) and isinstance(v, str) for k, v in env.items()
        ):
            raise ProgramsFileError(f"{where}: {name}.env must map variable names to text")
        found[name] = Program(name, tuple(argv), dict(env))
    return found


def program_argv(argv: Sequence[str]) -> list[str]:
    """A program's argv as it runs: `python` first is the worker's interpreter, and an argument
    naming a file or folder of the install (`oz0agents/examples/jsonl_agent.py`) its absolute path,
    since the program starts in a folder of its own."""
    resolved = []
    for index, part in enumerate(argv):
        if index == 0 and part == "python":
            resolved.append(sys.executable)
            continue
        if not part.startswith("-") and not os.path.isabs(part) and (index > 0 or "/" in part):
            candidate = Path(settings.BASE_DIR) / part
            if candidate.exists():
                resolved.append(str(candidate))
                continue
        resolved.append(part)
    return resolved

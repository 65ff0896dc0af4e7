"""The virtual environment: created, and requirements.txt installed whenever its hash changes.

The launcher runs this on the machine's Python before `.venv` exists: standard library only.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from oz0cli import ROOT, Fatal, say

VENV = ROOT / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
REQUIREMENTS = ROOT / "requirements.txt"
STAMP = VENV / ".oz0-requirements.sha256"


def inside_venv() -> bool:
    return Path(sys.prefix).resolve() == VENV.resolve()


def requirements_digest(requirements: Path = REQUIREMENTS) -> str:
    return hashlib.sha256(requirements.read_bytes()).hexdigest()


def venv_is_current(digest: str, *, python: Path = VENV_PYTHON, stamp: Path = STAMP) -> bool:
    """The venv is reused only when it exists and was installed from exactly these requirements."""
    return python.exists() and stamp.exists() and stamp.read_text().strip() == digest


def uv_pin(requirements_text: str) -> str:
    """The uv that requirements.txt pins (pip installs it), or the newest when it pins none."""
    pins = [line.strip() for line in requirements_text.splitlines() if line.strip().lower().startswith("uv==")]
    return pins[0] if pins else "uv"


def find_uv() -> str | None:
    """uv installs the requirements in seconds where pip takes minutes; pip installs uv itself
    (the version requirements.txt pins). Without it, pip does the whole job."""
    for candidate in (VENV / "bin" / "uv", shutil.which("uv")):
        if candidate and Path(candidate).exists():
            return str(candidate)
    result = subprocess.run(
        [str(VENV_PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q", uv_pin(REQUIREMENTS.read_text())],
        stdout=subprocess.DEVNULL,
    )
    return str(VENV / "bin" / "uv") if result.returncode == 0 and (VENV / "bin" / "uv").exists() else None


def install_command(uv: str | None) -> list[str]:
    """uv compiles the bytecode at install as pip does (uv's default is not to): a harness's
    bridge runs in a sandbox that mounts the venv read-only, so it could never write the .pyc of
    its framework and would compile it from source at every start (≈ 1.5 s of CPU for pydantic_ai
    or the Agents SDK)."""
    if uv:
        return [uv, "pip", "install", "--compile-bytecode", "--python", str(VENV_PYTHON), "-r", str(REQUIREMENTS)]
    return [str(VENV_PYTHON), "-m", "pip", "install", "--disable-pip-version-check", "-q", "-r", str(REQUIREMENTS)]


def ensure_venv() -> None:
    digest = requirements_digest()
    if venv_is_current(digest):
        return
    if not VENV_PYTHON.exists():
        if sys.version_info < (3, 11):  # noqa: UP036 - the machine's own Python runs this part
            raise Fatal(f"oz0 needs Python 3.11 or newer; {sys.executable} is {sys.version.split()[0]}")
        say(f"creating {VENV.relative_to(ROOT)} with {sys.executable}")
        if subprocess.run([sys.executable, "-m", "venv", str(VENV)]).returncode != 0:
            shutil.rmtree(VENV, ignore_errors=True)
            raise Fatal("could not create .venv (on Debian or Ubuntu: apt-get install python3-venv)")
    say("installing requirements.txt into .venv")
    result = subprocess.run(install_command(find_uv()))
    if result.returncode != 0:
        raise Fatal(f"installing requirements.txt failed (exit {result.returncode}); see the output above")
    STAMP.write_text(digest + "\n")

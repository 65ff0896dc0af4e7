"""How a harness process is confined (F7): the code runs as the installer allowed, but it must not
reach what the worker holds. Whatever the worker runs as (root under `./oz0 up`, or a service
user), a harness process

- cannot read the worker's environment or the install's secrets: with `OZ0_HARNESS_SANDBOX=bwrap`
  (the default) it runs in a bubblewrap sandbox with its own process ids (the worker's
  /proc/<pid> does not exist there) and its own mounts (the system's programs and libraries, the
  worker's interpreter, the files its program names and its own folders, read-only; never the
  install's folder), and, when the worker is root, as `OZ0_HARNESS_USER` (default `nobody`)
  inside it. With `OZ0_HARNESS_SANDBOX=user` a root worker only switches it to that user (file
  permissions then keep it from the secrets; every harness shares that one user);
- starts in a folder of its own (its HOME and TMPDIR): a fresh temporary one removed when it
  ends, or its round's (`folder=`: under OZ0's jobs folder, kept across the sessions of one round
  on this machine, a retry's too, and removed once the round needs it no more: folders.py);
- inherits no descriptors but its three standard streams, and only the environment it is given
  (never the worker's): PATH, HOME, TMPDIR, LANG, LC_ALL, TZ, then the program's own;
- runs under limits: OZ0_HARNESS_CPU_SECONDS, OZ0_HARNESS_MEMORY_MB (writable memory),
  OZ0_HARNESS_PROCESSES (the harness user's processes and threads together).

The worker's interpreter lives where the harness user may not read it (a virtualenv whose Python
sits under root's private home, here): the sandbox mounts the interpreter's folders at their own
paths with their parents readable, so `python` in a program's argv is the worker's interpreter and
its packages. `launch.py`, run by that interpreter before anything else, sets the limits, switches
the user and starts the program.
"""

from __future__ import annotations

import hashlib
import os
import pwd
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

LAUNCHER = Path(__file__).with_name("launch.py")
# What every sandbox may read: the system's programs and libraries, and the few files of /etc a
# program needs to resolve names, verify TLS and know the time (never all of /etc).
SYSTEM_READS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_READS = (
    "/etc/alternatives",
    "/etc/ca-certificates",
    "/etc/ssl",
    "/etc/pki",
    "/etc/resolv.conf",
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/host.conf",
    "/etc/gai.conf",
    "/etc/localtime",
    "/etc/timezone",
    "/etc/passwd",
    "/etc/group",
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/mime.types",
)
INHERITED_ENV = ("LANG", "LC_ALL", "TZ")


class SandboxUnavailable(Exception):
    """This machine cannot confine a harness as configured; the message says what to change."""


@dataclass
class Confined:
    """A confined process's argv, environment and working folder; `cleanup` removes the folder,
    unless it is its round's, `kept` for the round's next session (folders.py removes it)."""

    argv: list[str]
    env: dict[str, str]
    job_dir: Path
    kept: bool = False

    def cleanup(self) -> None:
        if not self.kept:
            shutil.rmtree(self.job_dir, ignore_errors=True)


# The folder that holds the rounds' kept folders: the worker's own (a harness user can create nothing
# in it, nor list it), each round's folder in it the harness user's. One per database (the digest
# of its address in the name): oz0s on one machine with databases of their own never take each
# other's runs for gone.
JOBS = "oz0-harness-jobs"


def jobs_folder() -> Path:
    from django.db import connection

    where = connection.settings_dict
    database = hashlib.sha256(f"{where.get('HOST')}:{where.get('PORT')}/{where.get('NAME')}".encode()).hexdigest()[:8]
    root = Path(tempfile.gettempdir()) / f"{JOBS}-{database}"
    try:
        os.mkdir(root, 0o711)
    except FileExistsError:
        pass
    found = os.lstat(root)
    if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.geteuid():
        raise SandboxUnavailable(f"{root} is not a folder of the worker's own (a symlink, or someone else's): remove it")
    if stat.S_IMODE(found.st_mode) != 0o711:
        os.chmod(root, 0o711)
    return root


def _job_folder(folder: str | None, label: str) -> Path:
    if folder is None:
        return Path(tempfile.mkdtemp(prefix=f"oz0-harness-{os.getpid()}-{label}-"))
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", folder) or folder in (".", ".."):
        raise SandboxUnavailable(f"{folder!r} cannot name a job folder")
    path = jobs_folder() / folder
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise SandboxUnavailable(f"{path} is not a folder: remove it") from None
    return path


def interpreter_folders() -> list[Path]:
    """The folders the worker's interpreter and its packages live in."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix]
    found.append(os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return [Path(p) for p in dict.fromkeys(found)]


def reads_of(argv: Sequence[str]) -> list[Path]:
    """What a program needs to read besides the system: the files and folders its argv names (a
    file with its folder, unless that folder is the install's own or one above it)."""
    install = Path(settings.BASE_DIR).resolve()
    reads: list[Path] = []
    for part in argv:
        if not os.path.isabs(part) or not os.path.exists(part):
            continue
        path = Path(part)
        folder = path if path.is_dir() else path.parent
        reads.append(path if folder.resolve() in (install, *install.parents) else folder)
    return reads


def confine(
    argv: Sequence[str], env: Mapping[str, str], *, reads: Iterable[Path] = (), label: str = "job", folder: str | None = None
) -> Confined:
    """Start `argv` confined: what to hand to Popen (argv, env) and the job's folder (the process's
    working folder, HOME and TMPDIR): a fresh one, or the kept one named `folder` (made the first
    time). Raises SandboxUnavailable when this machine cannot."""
    mode = settings.OZ0_HARNESS_SANDBOX
    root = os.geteuid() == 0
    if mode == "user" and not root:
        raise SandboxUnavailable(
            "OZ0_HARNESS_SANDBOX=user switches harnesses to OZ0_HARNESS_USER, which needs a worker running as root; "
            "install bubblewrap and use OZ0_HARNESS_SANDBOX=bwrap"
        )
    bwrap = shutil.which("bwrap") if mode == "bwrap" else None
    if mode == "bwrap" and bwrap is None:
        raise SandboxUnavailable(
            "bubblewrap is not installed (Debian: apt-get install bubblewrap); "
            "or set OZ0_HARNESS_SANDBOX=user on a worker running as root"
        )
    user = _harness_user() if root else None
    remove_orphans()
    job_dir = _job_folder(folder, label)
    if user is not None:
        os.chown(job_dir, user.pw_uid, user.pw_gid)
    job_dir.chmod(0o700)
    path = os.pathsep.join(dict.fromkeys([os.path.dirname(sys.executable), "/usr/local/bin", "/usr/bin", "/bin"]))
    environment = {name: os.environ[name] for name in INHERITED_ENV if name in os.environ}
    environment.update({"PATH": path, "HOME": str(job_dir), "TMPDIR": str(job_dir)})
    if settings.OZ0_HARNESS_WRITABLE:
        environment["OZ0_HARNESS_WRITABLE"] = ",".join(settings.OZ0_HARNESS_WRITABLE)
    environment.update(env)
    launcher = [sys.executable, "-I", "-S", str(LAUNCHER), *_launch_options(user, job_dir, environment), "--"]
    if bwrap is None:
        return Confined([*launcher, *argv], environment, job_dir, kept=folder is not None)
    binds = _bwrap_binds([*interpreter_folders(), LAUNCHER, *reads], job_dir)
    namespaces = ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not settings.OZ0_HARNESS_NETWORK:
        namespaces.append("--unshare-net")
    if root:
        # Root inside keeps only what switching to the harness user takes; the launcher then drops it.
        privileges = ["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    else:
        privileges = ["--unshare-user", "--cap-drop", "ALL"]
    command = [bwrap, "--die-with-parent", *namespaces, *privileges, *binds, "--chdir", "/", "--", *launcher, *argv]
    return Confined(command, environment, job_dir, kept=folder is not None)


ORPHAN = re.compile(r"^oz0-harness-(\d+)-")


def remove_orphans() -> None:
    """Remove the folders of harnesses whose worker died before it could (a kill, a crash): each
    folder's name carries its worker's process id."""
    try:
        names = os.listdir(tempfile.gettempdir())
    except OSError:
        return
    for name in names:
        found = ORPHAN.match(name)
        if found is None or int(found.group(1)) == os.getpid():
            continue
        try:
            os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(os.path.join(tempfile.gettempdir(), name), ignore_errors=True)
        except PermissionError:
            pass  # alive, someone else's


def _harness_user() -> pwd.struct_passwd:
    name = str(settings.OZ0_HARNESS_USER)
    try:
        user = pwd.getpwnam(name)
    except KeyError:
        raise SandboxUnavailable(f"OZ0_HARNESS_USER names {name!r}, which is no user of this machine") from None
    if user.pw_uid == 0 or user.pw_gid == 0:
        raise SandboxUnavailable(f"OZ0_HARNESS_USER {name!r} is root or in root's group: name an unprivileged user")
    return user


def _launch_options(user: pwd.struct_passwd | None, job_dir: Path, env: Mapping[str, str]) -> list[str]:
    options = [
        f"--cwd={job_dir}",
        f"--env={','.join(sorted(env))}",
        f"--cpu={max(0, int(settings.OZ0_HARNESS_CPU_SECONDS))}",
        f"--memory={max(0, int(settings.OZ0_HARNESS_MEMORY_MB)) * 1024 * 1024}",
        f"--processes={max(0, int(settings.OZ0_HARNESS_PROCESSES))}",
    ]
    if user is not None:
        options += [f"--uid={user.pw_uid}", f"--gid={user.pw_gid}"]
    return options


def _bwrap_binds(reads: Iterable[Path], job_dir: Path) -> list[str]:
    """bwrap's mounts: the system read-only, a fresh /tmp, /proc of the sandbox's own processes, a
    minimal /dev, then each path read-only at its own path (its parents made readable: bwrap would
    make them root's alone), the job's folder and OZ0_HARNESS_WRITABLE read-write."""
    args: list[str] = []
    for system in SYSTEM_READS:
        args += ["--ro-bind-try", system, system]
    args += ["--perms", "0755", "--dir", "/etc"]
    for name in ETC_READS:
        args += ["--ro-bind-try", name, name]
    # /tmp is memory: it holds at most what the process may hold.
    size = ["--size", str(int(settings.OZ0_HARNESS_MEMORY_MB) * 1024 * 1024)] if settings.OZ0_HARNESS_MEMORY_MB > 0 else []
    args += ["--proc", "/proc", "--dev", "/dev", "--perms", "01777", *size, "--tmpfs", "/tmp"]
    # Paths that exist in the sandbox as they do outside (a bind shows the host's folder), and the
    # mount points whose insides the sandbox makes up (the root and /tmp are empty file systems).
    bound = [Path(p) for p in (*SYSTEM_READS, *ETC_READS, "/proc", "/dev")]
    points = {Path("/"), Path("/etc"), Path("/tmp")}
    wanted = [(Path(os.path.abspath(p)), "--ro-bind") for p in reads if os.path.exists(p)]
    wanted += [(Path(p), "--bind") for p in settings.OZ0_HARNESS_WRITABLE if os.path.isdir(p)]
    wanted.append((job_dir, "--bind"))
    for path, how in sorted(dict.fromkeys(wanted), key=lambda item: len(item[0].parts)):
        if any(path == b or b in path.parents for b in bound):
            continue  # already there (/usr/lib/python3, a file of a bound folder)
        for parent in reversed(path.parents):
            if parent in points or any(parent == b or b in parent.parents for b in bound):
                continue
            args += ["--perms", "0755", "--dir", str(parent)]
            points.add(parent)
        args += [how, str(path), str(path)]
        bound.append(path)
    return args

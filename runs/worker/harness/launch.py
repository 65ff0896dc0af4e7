"""The last step before a harness program runs (never imported by oz0): started by the worker's own
interpreter (`python -I -S launch.py OPTIONS -- PROGRAM ARGS...`), inside the bubblewrap sandbox
or, with OZ0_HARNESS_SANDBOX=user, straight from the worker, it

- leaves the worker's session (no controlling terminal to type into),
- sets the resource limits (CPU seconds, writable memory, processes, no core files),
- switches to the harness user when started as root (groups, group, user: no way back),
- keeps only the environment variables the worker named (a library that spawned it may add its own),
- enters the job's fresh temporary directory with a private umask,
- and replaces itself with the program. A program it cannot start exits 69 (EX_UNAVAILABLE),
  which the worker reports as `harness_unavailable`.
"""

import os
import resource
import sys

UNAVAILABLE_EXIT = 69


def main(args: list[str]) -> None:
    split = args.index("--")
    options = dict(option.split("=", 1) for option in args[:split])
    program = args[split + 1 :]
    try:
        os.setsid()
    except OSError:
        pass  # already a session's leader (the worker started it so)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(options.get("--cpu", "0"))
    if cpu > 0:
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))  # SIGXCPU first, SIGKILL 5 s later
    memory = int(options.get("--memory", "0"))
    if memory > 0:
        resource.setrlimit(resource.RLIMIT_DATA, (memory, memory))
    processes = int(options.get("--processes", "0"))
    if processes > 0:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    if "--uid" in options:
        uid, gid = int(options["--uid"]), int(options["--gid"])
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        if os.getuid() != uid or os.geteuid() != uid or uid != 0 and _can_regain_root():
            sys.exit("oz0's launcher could not drop its privileges")
    keep = set(filter(None, options.get("--env", "").split(",")))
    environment = {name: value for name, value in os.environ.items() if name in keep}
    os.umask(0o077)
    os.chdir(options["--cwd"])
    try:
        os.execvpe(program[0], program, environment)
    except OSError as error:
        print(f"oz0 cannot start {program[0]!r}: {error.strerror or error}", file=sys.stderr, flush=True)
        os._exit(UNAVAILABLE_EXIT)


def _can_regain_root() -> bool:
    try:
        os.setuid(0)
    except PermissionError:
        return False
    return True


if __name__ == "__main__":
    main(sys.argv[1:])

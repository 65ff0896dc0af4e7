"""The JSON-lines harness, protocol versions 1 and 2 (docs/harness-jsonl.md): a process that reads one JSON
object per line on stdin and writes one per line on stdout (logs on stderr only, lines at most 1 MiB).

The process is a program the installer lists (`oz0agents.harness_programs`), named by the manifest's
`program:`, and runs confined (`sandbox.confine`). oz0 sends `start`, then a `result` for each
`call`, and `cancel` when the run stops; the harness sends `call`s (registry tools, the built-ins
`oz.fail`, `oz.ask` and `oz.approval`, the delegating built-ins it lists) and ends with `done`. A run
cancel sends `cancel`, then SIGTERM after a grace, then SIGKILL. A process that cannot start is
`harness_unavailable`; one that exits before `done` is `harness_crashed`; a line that is not a
protocol message is `harness_protocol_error`. Its stderr is kept on the task (words, redacted).
Version 2 (`protocol: 2` in the manifest, and the framework bridges) adds the round's `journal` and
`resume` to `start`, and the harness's `checkpoint` and `resumed` messages (runs/kernel/journal.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from oz0agents.harness_programs import ProgramsFileError, program, program_argv
from runs.worker.harness import folders
from runs.worker.harness.base import (
    HarnessCanceled,
    HarnessError,
    HarnessParked,
    HarnessProtocolError,
    HarnessReleased,
    HarnessSession,
    HarnessUnavailable,
)
from runs.worker.harness.channel import (  # noqa: F401 (the ACP adapter takes these from here)
    CANCEL_GRACE_SECONDS,
    LINE_MAX,
    STDERR_BUFFER,
    TERM_GRACE_SECONDS,
    UNAVAILABLE_EXIT,
    Channel,
)
from runs.worker.harness.model_calls import record_model_use
from runs.worker.harness.sandbox import Confined, SandboxUnavailable, confine, reads_of

# The newest protocol oz0 speaks; a program speaks 1 unless its manifest says `protocol: 2`.
PROTOCOL = 2


def installed_program(session: HarnessSession) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of the program the manifest names, as the installer lists it now;
    the manifest's `env` first, the installer's over it."""
    harness = session.harness
    name = harness.get("program")
    if not isinstance(name, str):
        raise HarnessUnavailable(
            f"the {harness.get('kind')} harness names no program: oz0 runs only programs the installer lists in "
            "OZ0_HARNESS_PROGRAMS (a manifest's own `command:` is refused); register a version naming one"
        )
    try:
        found = program(name)
    except ProgramsFileError as broken:
        raise HarnessUnavailable(str(broken)) from None
    if found is None:
        raise HarnessUnavailable(f"the program {name!r} is no longer one the installer allows (OZ0_HARNESS_PROGRAMS)")
    return program_argv(found.argv), {**(harness.get("env") or {}), **found.env}


def run(session: HarnessSession) -> Any:
    argv, env = installed_program(session)
    return converse(session, argv, env, reads=reads_of(argv), protocol=spoken_protocol(session))


def spoken_protocol(session: HarnessSession) -> int:
    """The protocol version the manifest says its program speaks: 1 when it says nothing, so a
    program written for version 1 gets the `start` it was written for."""
    declared = session.harness.get("protocol", 1)
    return declared if declared in (1, PROTOCOL) else 1


def confined(session: HarnessSession, argv: Sequence[str], env: Mapping[str, str], reads: Iterable[Path]) -> Confined:
    """The harness process's confinement, in its round's kept folder (folders.py: a session of the
    round started again finds what the earlier ones left); a machine that cannot confine it is
    `harness_unavailable`."""
    folders.sweep()
    session.job_folder = folders.folder_name(session.run.pk, session.task.key)
    try:
        return confine(argv, {"PYTHONUNBUFFERED": "1", **env}, reads=reads, folder=session.job_folder)
    except SandboxUnavailable as error:
        session.job_folder = ""
        raise HarnessUnavailable(f"the harness cannot be confined here: {error}") from None


def converse(
    session: HarnessSession,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    reads: Iterable[Path] = (),
    protocol: int = 1,
) -> Any:
    """Run the job with a harness process speaking `protocol` to its end; its `done` output. The
    versions differ only in `start` (2 adds `journal`)."""
    if not argv:
        raise HarnessUnavailable("the harness names no program")
    channel = Channel.spawn(confined(session, argv, env, reads))
    session.stderr_source = channel.stderr_text
    # A wait on a person past the park clock gives the thread back, the process kept (keeper.py).
    session.releases = True
    return drive(session, channel, protocol)


def drive(session: HarnessSession, channel: Channel, protocol: int, pending: tuple[Any, str] | None = None) -> Any:
    """Converse with the harness process to its end: from `start`, or (`pending`: the call's id and
    key) from the answer to the call a released session waited on (runs/worker/harness/keeper.py)."""
    released = False
    call_id: Any = None
    try:
        if pending is None:
            channel.send(session.start_message(protocol))
        else:
            call_id = pending[0]
            # Ended while it was released (its output closed, or flooded): reported as it ended.
            early = channel.ended_early()
            if early is not None:
                raise early
            channel.send(session.answer(pending[1]).as_message(call_id))
        while True:
            message = channel.receive(session)
            record_model_use(session, message)
            kind = message.get("type")
            if kind == "done":
                return message.get("output")
            if kind == "usage":
                session.model_requested()
                continue  # a model request's tokens (a bridge's, or with no call to carry them): billed above
            if kind in ("checkpoint", "resumed") and protocol >= 2:
                _journal_message(session, message)
                continue
            if kind != "call":
                raise HarnessProtocolError(f"the harness sent a message of type {kind!r}; it sends `call` or `done`")
            call_id, tool, args = message.get("id"), message.get("tool"), message.get("args", {})
            if not isinstance(call_id, str | int) or isinstance(call_id, bool):
                raise HarnessProtocolError("a `call` needs an `id` (a string or an integer)")
            if not isinstance(args, Mapping):
                raise HarnessProtocolError(f"call {call_id!r}'s `args` is not an object")
            if tool == "oz.fail":
                channel.settle_stderr()  # what it wrote before ending the job is kept on the round
                session.fail(args.get("kind"), args.get("message"))
            if tool == "oz.ask":
                result = session.ask(args.get("question"))
            elif tool == "oz.approval":
                result = session.approval(args.get("tool"), args.get("args", {}))
            else:
                result = session.call_tool(tool, args)
            channel.send(result.as_message(call_id))
    except HarnessReleased as waiting:
        from runs.worker.harness.keeper import Released, keeper

        # The process and its pipes go to the keeper's loop; this thread goes back to its worker.
        released = True
        pending = (call_id, waiting.key)
        keeper().take(
            Released(
                session,
                key=waiting.key,
                waited=waiting.waited,
                resume=partial(drive, session, channel, protocol, pending),
                stop=partial(_stop, channel),
                channel=channel,
            )
        )
        raise
    except HarnessParked:
        channel.kill()  # it waits on the call it was parked on; its state is stored
        raise
    except HarnessCanceled:
        if session.timed_out.is_set():
            channel.kill()  # past its deadline: no `cancel` line, no grace
        else:
            channel.cancel()
        raise
    except HarnessError as error:
        channel.close()
        error.stderr = channel.stderr_text()
        raise
    finally:
        if not released:
            # Closed first: the stderr kept is all the process wrote, up to its end.
            channel.close()
            session.stderr = channel.stderr_text()


def _stop(channel: Channel) -> None:
    channel.kill()
    channel.close()


def _journal_message(session: HarnessSession, message: Mapping[str, Any]) -> None:
    """Protocol 2: `checkpoint` keeps the harness's own state for a session started again;
    `resumed` says it resumed from the `start.resume` it was handed."""
    if message.get("type") == "checkpoint":
        if "state" not in message:
            raise HarnessProtocolError("a `checkpoint` needs a `state`")
        session.checkpoint(message["state"])
    else:
        session.resumed()

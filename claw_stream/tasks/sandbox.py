"""The terminal agent's sandbox: commands run in a scratch directory, never outside it.

Confinement comes from what may run, not from hoping: no shell (a command is split with
shlex and executed directly, so there are no pipes, substitutions or `cd`), only the
programs in `PROGRAMS` (none of which can run another program or open a path it is not
given), and every argument that could name a path must resolve (symlinks followed) inside
the scratch directory. `> file` and `>> file` are honoured by the sandbox itself, with the
same check. Each command runs in its own process group, with the scratch directory as its
working directory and HOME, a file-size limit, a CPU limit, a wall-clock limit (past it the
whole group is killed) and an output limit (past it too).
"""

from __future__ import annotations

import asyncio
import contextlib
import glob
import os
import resource
import shlex
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

# coreutils-style programs that only touch the paths named in their arguments
PROGRAMS = frozenset(
    {
        "cat", "cp", "cut", "echo", "head", "ls", "mkdir", "mv", "printf", "pwd", "rm",
        "rmdir", "seq", "sleep", "sort", "tail", "touch", "tr", "uniq", "wc", "grep", "true",
        "false", "basename", "dirname",
    }
)  # fmt: skip
SHELL_SYNTAX = ("|", ";", "&", "`", "$(", "<")


class SandboxRefusal(ValueError):
    """A command the sandbox will not run; the message says why (the agent sees it)."""


@dataclass(frozen=True)
class CommandResult:
    command: str
    exit_code: int | None  # None: killed or refused
    output: str  # stdout + stderr, cut at the output limit
    timed_out: bool = False
    truncated: bool = False
    refused: str | None = None

    def for_model(self) -> str:
        """What the agent reads back as the tool's answer."""
        if self.refused is not None:
            return f"refused: {self.refused}"
        notes = []
        if self.timed_out:
            notes.append("killed: time limit reached")
        if self.truncated:
            notes.append("killed: output limit reached")
        if self.exit_code not in (0, None):
            notes.append(f"exit code {self.exit_code}")
        return (
            "\n".join([self.output.rstrip(), *(f"[{n}]" for n in notes)]).strip() or "(no output)"
        )


class Sandbox:
    def __init__(
        self,
        root: Path,
        *,
        time_limit_s: float = 5.0,
        output_limit: int = 16_384,
        file_limit: int = 1_048_576,
    ):
        root.mkdir(parents=True, exist_ok=True)
        self.root = root.resolve()
        self.time_limit_s = time_limit_s
        self.output_limit = output_limit
        self.file_limit = file_limit

    def write_files(self, files: dict[str, str]) -> None:
        for name, content in files.items():
            path = self.inside(name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)

    def inside(self, name: str) -> Path:
        """`name` resolved against the scratch directory; refused when it leaves it."""
        resolved = (self.root / name).resolve()  # an absolute name replaces the root
        if resolved != self.root and self.root not in resolved.parents:
            raise SandboxRefusal(f"{name!r} is outside the scratch directory")
        return resolved

    def _check_argument(self, arg: str) -> None:
        candidates = {arg}
        if arg.startswith("-"):
            candidates.add(arg.split("=", 1)[1] if "=" in arg else arg.lstrip("-")[1:])
        for value in candidates:
            if value:
                self.inside(value)

    def _expand(self, arg: str) -> list[str]:
        if not any(ch in arg for ch in "*?["):
            return [arg]
        found = sorted(glob.glob(arg, root_dir=self.root))
        return found or [arg]

    def parse(self, command: str) -> tuple[list[str], Path | None, bool]:
        """argv, the file stdout goes to (or None) and whether it appends; refusals raise."""
        if any(token in command for token in SHELL_SYNTAX):
            raise SandboxRefusal(
                "one command at a time: no pipes, ';', '&', '<', backticks or $(...)"
            )
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise SandboxRefusal(f"cannot parse the command: {exc}") from None
        target: Path | None = None
        append = False
        for op in (">>", ">"):
            if op in words:
                at = words.index(op)
                if at != len(words) - 2:
                    raise SandboxRefusal(f"'{op}' must be followed by one file name at the end")
                target, append = self.inside(words[-1]), op == ">>"
                words = words[:at]
                break
        if not words:
            raise SandboxRefusal("empty command")
        if words[0] not in PROGRAMS:
            raise SandboxRefusal(
                f"{words[0]!r} is not available; use one of: {', '.join(sorted(PROGRAMS))}"
            )
        argv = [words[0]]
        for arg in words[1:]:
            self._check_argument(arg)
            argv.extend(self._expand(arg))
        program = shutil.which(argv[0])
        if program is None:
            raise SandboxRefusal(f"{argv[0]!r} is not installed here")
        return [program, *argv[1:]], target, append

    def _limits(self) -> None:  # runs in the child, before exec
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.file_limit, self.file_limit))
        cpu = max(1, int(self.time_limit_s) + 1)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))

    async def run(self, command: str) -> CommandResult:
        try:
            argv, target, append = self.parse(command)
        except SandboxRefusal as exc:
            return CommandResult(command, None, "", refused=str(exc))
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.root)}
        env |= {"TMPDIR": str(self.root), "LC_ALL": "C.UTF-8"}
        sink = target.open("ab" if append else "wb") if target is not None else None
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                cwd=self.root,
                env=env,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=sink if sink is not None else asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT if sink is None else asyncio.subprocess.PIPE,
                start_new_session=True,
                preexec_fn=self._limits,
            )
        finally:
            if sink is not None:
                sink.close()
        output = bytearray()
        truncated = timed_out = False

        stream = proc.stdout if proc.stdout is not None else proc.stderr
        assert stream is not None

        async def read() -> None:
            nonlocal truncated
            while chunk := await stream.read(4096):
                output.extend(chunk)
                if len(output) > self.output_limit:
                    truncated = True
                    return

        try:
            await asyncio.wait_for(read(), self.time_limit_s)
            if not truncated:
                await asyncio.wait_for(proc.wait(), self.time_limit_s)
        except TimeoutError:
            timed_out = True
        if timed_out or truncated:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            # Python 3.11's wait() returns only once the pipe is closed too, and a pipe whose
            # reading stopped (paused, its buffer full) never sees its end: read it to the end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(_drain(stream), 5)
        code: int | None = None
        with contextlib.suppress(TimeoutError):
            code = await asyncio.wait_for(proc.wait(), 10)
        text = bytes(output[: self.output_limit]).decode(errors="replace")
        return CommandResult(
            command,
            None if timed_out or truncated else code,
            text,
            timed_out=timed_out,
            truncated=truncated,
        )


async def _drain(stream: asyncio.StreamReader) -> None:
    while await stream.read(65536):
        pass

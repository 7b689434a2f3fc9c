"""The programs a ``FakeExecutor`` knows, and a very small ``sh -c`` to combine them.

This is a stand-in for tests of logic, never a shell: it knows exactly what is written here
and answers anything else as a real shell answers an unknown command (status 127) or a
syntax it cannot parse (status 2), so a test that leans on more fails loudly.

Programs (found by the base name of ``argv[0]``)
    ``true``, ``false``; ``echo [-n] WORD...``; ``sleep SECONDS`` (``infinity`` too; it
    waits on the event loop's clock, so deadlines and cancels reach it); ``seq [FIRST] LAST``;
    ``printenv [NAME]``; ``sh -c SCRIPT [NAME [ARG...]]`` (also ``bash``); and any program a
    test adds (``FakeExecutor(programs=...)``), which wins over these.

The ``sh -c`` script
    Commands separated by ``;`` or newlines, joined by ``&&`` and ``||``; ``exit [N]``;
    words quoted with ``'...'`` (literal), ``"..."`` (expanding) or ``\\x``; ``$NAME``,
    ``${NAME}``, ``$0``..``$9``, ``$?`` and ``$$`` expanded (never split into several
    words); ``>&2`` and ``1>&2`` accepted and ignored (stdout and stderr are one stream, as
    with every backend). Pipes, other redirections, globs, subshells and ``&`` are not
    understood: status 2 and a message saying so. An assignment (``A=1``) is taken for a
    command's name, so it is not found (127).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field

__all__ = ["BUILTINS", "FakeProcess", "Program", "run_program"]


@dataclass
class FakeProcess:
    """What a fake program sees: its argv and environment, and where its output goes."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    write: Callable[[bytes], None] = field(default=lambda data: None)  # set by the executor
    programs: Mapping[str, Program] = field(default_factory=dict)

    def say(self, text: str) -> None:
        """Write ``text`` (UTF-8) to the output."""
        self.write(text.encode())


Program = Callable[[FakeProcess], Awaitable[int]]
"""A fake program: writes its output through ``FakeProcess.write``, returns its exit status.
It may await (``asyncio.sleep``, an event a test sets); a cancel arrives as ``CancelledError``."""


async def run_program(process: FakeProcess) -> int:
    """Run ``process.argv`` with the program its first word names."""
    if not process.argv:
        process.say("fake: empty command\n")
        return 127
    name = os.path.basename(process.argv[0])
    program = process.programs.get(name) or BUILTINS.get(name)
    if program is None:
        process.say(f"fake: {process.argv[0]}: command not found\n")
        return 127
    return await program(process)


async def _true(process: FakeProcess) -> int:
    return 0


async def _false(process: FakeProcess) -> int:
    return 1


async def _echo(process: FakeProcess) -> int:
    words = process.argv[1:]
    newline = not (words and words[0] == "-n")
    if not newline:
        words = words[1:]
    process.say(" ".join(words) + ("\n" if newline else ""))
    return 0


async def _sleep(process: FakeProcess) -> int:
    if len(process.argv) != 2:
        process.say("sleep: one operand expected\n")
        return 1
    operand = process.argv[1]
    if operand == "infinity":
        await asyncio.Event().wait()
    try:
        seconds = float(operand)
    except ValueError:
        process.say(f"sleep: invalid time interval {operand!r}\n")
        return 1
    await asyncio.sleep(seconds)
    return 0


async def _seq(process: FakeProcess) -> int:
    try:
        bounds = [int(word) for word in process.argv[1:]]
    except ValueError:
        process.say("seq: invalid integer\n")
        return 1
    if len(bounds) not in (1, 2):
        process.say("seq: one or two operands expected\n")
        return 1
    first, last = (1, bounds[0]) if len(bounds) == 1 else (bounds[0], bounds[1])
    batch: list[str] = []
    for number in range(first, last + 1):
        batch.append(f"{number}\n")
        if len(batch) == 4096:  # output in chunks, as a process writes it
            process.say("".join(batch))
            batch.clear()
            await asyncio.sleep(0)
    process.say("".join(batch))
    return 0


async def _printenv(process: FakeProcess) -> int:
    names = process.argv[1:]
    if not names:
        process.say("".join(f"{k}={v}\n" for k, v in sorted(process.env.items())))
        return 0
    values = [process.env[name] for name in names if name in process.env]
    process.say("".join(f"{value}\n" for value in values))
    return 0 if len(values) == len(names) else 1


async def _sh(process: FakeProcess) -> int:
    args = process.argv[1:]
    if not args or args[0] != "-c" or len(args) < 2:
        process.say("fake sh: only 'sh -c SCRIPT [NAME [ARG...]]' is understood\n")
        return 2
    positional = [args[2] if len(args) > 2 else process.argv[0], *args[3:]]
    try:
        script = list(_parse(args[1]))
    except _Unsupported as exc:
        process.say(f"fake sh: {exc}\n")
        return 2
    return await _Script(process, positional).run(script)


BUILTINS: dict[str, Program] = {
    "bash": _sh,
    "echo": _echo,
    "false": _false,
    "printenv": _printenv,
    "seq": _seq,
    "sh": _sh,
    "sleep": _sleep,
    "true": _true,
}


# -- the script -------------------------------------------------------------------------------


class _Unsupported(Exception):
    """Syntax this stand-in does not understand."""


@dataclass(frozen=True)
class _Var:
    name: str


Word = list[str | _Var]  # literal text and variables, expanded when the command runs


@dataclass(frozen=True)
class _Command:
    words: list[Word]
    joined_by: str  # how it follows the command before it: ";", "&&" or "||"


_SPECIAL = frozenset("|&<>()`*?[]~")


def _parse(script: str) -> Iterator[_Command]:
    """The commands of ``script``, each with the operator that joins it to the one before.

    Raises:
        _Unsupported: the script uses what this stand-in does not understand.
    """
    words: list[Word] = []
    joined_by = ";"
    for token in _tokens(script):
        if isinstance(token, str):  # an operator
            if words:
                yield _Command(words, joined_by)
            elif token != ";":
                raise _Unsupported(f"syntax error near {token!r}")
            words, joined_by = [], token
        else:
            words.append(token)
    if words:
        yield _Command(words, joined_by)


def _tokens(script: str) -> Iterator[Word | str]:
    """Words (as lists of parts) and the operators ``;``, ``&&`` and ``||``, as strings."""
    i, n = 0, len(script)
    word: Word | None = None
    while i < n:
        c = script[i]
        if c in " \t":
            if word is not None:
                yield word
                word = None
            i += 1
        elif c in ";\n":
            if word is not None:
                yield word
                word = None
            yield ";"
            i += 1
        elif script.startswith(("&&", "||"), i):
            if word is not None:
                yield word
                word = None
            yield script[i : i + 2]
            i += 2
        elif script.startswith((">&2", "1>&2"), i) and word is None:
            i += 4 if c == "1" else 3  # stdout and stderr are one stream: nothing to do
        elif c in _SPECIAL:
            raise _Unsupported(f"{c!r} is not understood (pipes, redirections, globs, ...)")
        else:
            word = word if word is not None else []
            i = _word_part(script, i, word)
    if word is not None:
        yield word


def _word_part(script: str, i: int, word: Word) -> int:
    """Append the part of a word that starts at ``i``; return where the next one starts."""
    c = script[i]
    if c == "'":
        end = script.find("'", i + 1)
        if end < 0:
            raise _Unsupported("unterminated single quote")
        word.append(script[i + 1 : end])
        return end + 1
    if c == '"':
        i += 1
        while i < len(script) and script[i] != '"':
            if script[i] == "$":
                i = _variable(script, i, word)
            elif script[i] == "\\" and i + 1 < len(script) and script[i + 1] in '"\\$`':
                word.append(script[i + 1])
                i += 2
            else:
                word.append(script[i])
                i += 1
        if i >= len(script):
            raise _Unsupported("unterminated double quote")
        return i + 1
    if c == "\\":
        if i + 1 < len(script):
            word.append(script[i + 1])
        return i + 2
    if c == "$":
        return _variable(script, i, word)
    word.append(c)
    return i + 1


def _variable(script: str, i: int, word: Word) -> int:
    """Parse ``$NAME``, ``${NAME}``, ``$N``, ``$?`` or ``$$`` at ``i`` (a lone ``$`` is text)."""
    rest = script[i + 1 :]
    if rest[:1] in ("?", "$") or rest[:1].isdigit():
        word.append(_Var(rest[0]))
        return i + 2
    if rest.startswith("{"):
        end = rest.find("}")
        if end < 0 or not rest[1:end].isidentifier():
            raise _Unsupported("only ${NAME} is understood inside braces")
        word.append(_Var(rest[1:end]))
        return i + 2 + end
    length = 0
    while length < len(rest) and (rest[length].isalnum() or rest[length] == "_"):
        length += 1
    if length == 0 or rest[0].isdigit():
        word.append("$")
        return i + 1
    word.append(_Var(rest[:length]))
    return i + 1 + length


class _Exit(Exception):
    def __init__(self, status: int) -> None:
        self.status = status


class _Script:
    def __init__(self, process: FakeProcess, positional: list[str]) -> None:
        self._process = process
        self._positional = positional
        self._status = 0

    async def run(self, commands: list[_Command]) -> int:
        try:
            for command in commands:
                if command.joined_by == "&&" and self._status != 0:
                    continue
                if command.joined_by == "||" and self._status == 0:
                    continue
                self._status = await self._run(command)
        except _Exit as exit_:
            return exit_.status
        return self._status

    async def _run(self, command: _Command) -> int:
        argv = ["".join(self._expand(part) for part in word) for word in command.words]
        if argv[0] == "exit":
            if len(argv) > 2 or (len(argv) == 2 and not argv[1].isdigit()):
                self._process.say("fake sh: exit: expected one number\n")
                raise _Exit(2)
            raise _Exit(int(argv[1]) % 256 if len(argv) == 2 else self._status)
        child = FakeProcess(
            argv, self._process.env, self._process.cwd, self._process.write,
            self._process.programs,
        )  # fmt: skip
        return await run_program(child)

    def _expand(self, part: str | _Var) -> str:
        if isinstance(part, str):
            return part
        name = part.name
        if name == "?":
            return str(self._status)
        if name == "$":
            return "1"
        if name.isdigit():
            index = int(name)
            return self._positional[index] if index < len(self._positional) else ""
        return self._process.env.get(name, "")

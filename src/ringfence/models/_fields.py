"""Field types and bounds the models share: ids, argument words, environments, timeouts.

The bounds keep an accepted request startable: the kernel caps argv and environ together
(ARG_MAX) and each string, and bubblewrap caps its own arguments.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic.config import JsonDict

__all__ = [
    "ARGV_BOUNDS",
    "ENV_BOUNDS",
    "ID_PATTERN",
    "MAX_ARGV_BYTES",
    "MAX_ENV_BYTES",
    "MAX_ENV_VALUE",
    "MAX_ENV_VARS",
    "MAX_TIMEOUT_SECONDS",
    "PROGRAM_FIRST",
    "Env",
    "Word",
    "checked_env",
]

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
MAX_TIMEOUT_SECONDS = 7 * 24 * 3600


def checked_env(env: dict[str, str]) -> dict[str, str]:
    # Names and values are checked by ``Env``'s own constraints; this is their total.
    total = sum(len(name) + len(value) + 2 for name, value in env.items())
    if total > MAX_ENV_BYTES:
        raise ValueError(f"the environment is {total} characters, more than {MAX_ENV_BYTES} in all")
    return env


# What a process's environment can hold: the kernel caps argv and environ together (ARG_MAX,
# 2 MiB here) and each string (128 KiB); bubblewrap caps its own arguments (three per
# variable). Bounded well inside all three, so an accepted environment always starts.
MAX_ENV_VARS = 1024
MAX_ENV_VALUE = 32 << 10
MAX_ENV_BYTES = 256 << 10
Env = Annotated[
    dict[
        Annotated[str, Field(pattern=_ENV_NAME, max_length=256)],
        Annotated[str, Field(max_length=MAX_ENV_VALUE, pattern=r"^[^\x00]*$")],
    ],
    Field(max_length=MAX_ENV_VARS, json_schema_extra={"additionalProperties": False}),
]
# Each word (argument) within the kernel's 128 KiB per string; all of them together well
# inside ARG_MAX beside the environment.
MAX_ARGV_BYTES = 512 << 10
Word = Annotated[str, Field(max_length=(128 << 10) - 1, pattern=r"^[^\x00]*$")]
PROGRAM_FIRST: JsonDict = {"prefixItems": [{"type": "string", "minLength": 1}]}
ARGV_BOUNDS = f" Words of at most {(128 << 10) - 1} characters, {MAX_ARGV_BYTES} with args in all."
ENV_BOUNDS = (
    f" At most {MAX_ENV_VARS} variables, names of at most 256 characters, values of at most "
    f"{MAX_ENV_VALUE}, {MAX_ENV_BYTES} characters in all."
)

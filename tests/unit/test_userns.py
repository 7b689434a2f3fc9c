"""Root inside (issue 16), the pure parts: the two-id map, bwrap's identity options, the
allocator's all-or-none pairs, the users each door takes."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from ringfence.backends.local.bwrap import SANDBOX_UID, WORKSPACE, Fds, bwrap_args
from ringfence.backends.local.rootfs import Entry, Kind
from ringfence.backends.local.uids import UidAllocator, UidClaims
from ringfence.backends.local.userns import (
    DOCKER_CAPABILITIES,
    NS_USER,
    HostIds,
    id_map,
    root_inside_args,
)
from ringfence.errors import SandboxUidsExhausted
from ringfence.models import ExecutionRequest, Mount, ResourceLimits
from ringfence.sandboxd.methods import ROOT_USER, SANDBOX_USER, USERS, user_refusal
from ringfence.server.routes.sandboxes import SandboxUser

LIMITS = ResourceLimits(memory=64 << 20, pids=16, cpus=1.0, disk=8 << 20)
LAYOUT = (Entry(Kind.RO_BIND, "/usr", "/usr"), Entry(Kind.DIR, "", "/var"))


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def test_the_map_has_exactly_root_and_the_user_on_the_sandboxs_own_uids() -> None:
    assert id_map(HostIds(root=2_000_000_010, user=2_000_000_011)) == (
        "0 2000000010 1\n1000 2000000011 1\n"
    )
    assert NS_USER == SANDBOX_UID == 1000


def test_root_inside_holds_dockers_capabilities_and_no_other() -> None:
    args = root_inside_args(9)
    assert _pairs(args, "--cap-add") == list(DOCKER_CAPABILITIES)
    assert len(DOCKER_CAPABILITIES) == 14 and "CAP_SYS_ADMIN" not in DOCKER_CAPABILITIES
    assert "CAP_SYS_PTRACE" not in DOCKER_CAPABILITIES
    assert _pairs(args, "--uid") == ["0"] and _pairs(args, "--gid") == ["0"]
    assert _pairs(args, "--userns-block-fd") == ["9"]


def test_a_root_inside_launch_waits_for_its_map_and_opens_mount_parents() -> None:
    daemon = Mount(source="/srv/daemon", target="/run/ringfence/sandboxd")
    request = ExecutionRequest(command=["true"], mounts=[daemon])
    argv = bwrap_args(LAYOUT, request, LIMITS, Fds(seccomp=5, info=6, block=7, userns_block=8))
    assert _pairs(argv, "--userns-block-fd") == ["8"] and _pairs(argv, "--info-fd") == ["6"]
    # bwrap refuses --disable-userns with an external map: the server forbids nesting.
    assert "--disable-userns" not in argv and "--unshare-user" in argv
    assert _pairs(argv, "--uid") == ["0"]
    made = [
        argv[i + 3]
        for i, word in enumerate(argv)
        if argv[i : i + 3] == ["--perms", "0755", "--dir"]
    ]
    assert made == ["/home", "/run", "/run/ringfence"]
    assert argv.index("--dir") < argv.index(WORKSPACE)
    # One-shot: unchanged.
    plain = bwrap_args(LAYOUT, request, LIMITS, Fds(seccomp=5, info=6, block=7))
    assert "--disable-userns" in plain and _pairs(plain, "--uid") == ["1000"]
    assert "--cap-add" not in plain and "--userns-block-fd" not in plain


def test_a_pair_of_uids_is_taken_whole_or_not_at_all(tmp_path: Path) -> None:
    allocator = UidAllocator(100, 102)
    allocator.check_free(3)
    with pytest.raises(SandboxUidsExhausted):
        allocator.check_free(4)
    allocator.acquire()
    allocator.acquire()
    with pytest.raises(SandboxUidsExhausted):
        allocator.check_free(2)
    allocator.check_free(1)


def test_acquire_many_gives_back_what_it_took_when_the_range_runs_out(tmp_path: Path) -> None:
    from ringfence.backends.local import uids as module

    class Three(module.SandboxUids):
        def __init__(self) -> None:
            self._allocator = UidAllocator(100, 102)
            self._claims = UidClaims(tmp_path / "claims")

    uids = Three()
    assert uids.acquire_many(2) == (100, 101)
    with pytest.raises(SandboxUidsExhausted) as refused:
        uids.acquire_many(2)
    assert "an interactive sandbox takes two" in refused.value.message
    assert uids.acquire_many(1) == (102,), "the one taken for the refused pair went back"
    uids.close()


def test_each_door_takes_the_user_and_root_and_refuses_anyone_else() -> None:
    assert USERS == (SANDBOX_USER, ROOT_USER) == ("user", "root")
    literal, none = get_args(get_args(SandboxUser)[0])  # the native routes' ?user=
    assert get_args(literal) == USERS and none is type(None)
    for user in (None, "user", "root"):
        assert user_refusal(user) is None
    assert user_refusal("bob") == (
        "user 'bob' is not available: a sandbox has the users 'user' and 'root' only"
    )
    # A daemon whose host cannot map root serves its one user and keeps its old words.
    assert user_refusal("root", ("user",), inside=True) == (
        "user 'root' is not available: this sandbox runs everything as its one "
        "unprivileged user 'user'"
    )

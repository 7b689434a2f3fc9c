import dataclasses

from ringfence.backends.local.bwrap import (
    LAUNCH_ENV,
    WORKSPACE,
    Fds,
    Overlay,
    Writable,
    bwrap_args,
    pack_args,
    sandbox_env,
)
from ringfence.backends.local.rootfs import Entry, Kind
from ringfence.models import ExecutionRequest, Mount, ResourceLimits

LIMITS = ResourceLimits(memory=64 << 20, pids=16, cpus=1.0, disk=8 << 20)
LAYOUT = (
    Entry(Kind.RO_BIND, "/usr", "/usr"),
    Entry(Kind.SYMLINK, "usr/bin", "/bin"),
    Entry(Kind.DIR, "", "/etc"),
)


def _argv(**kwargs: object) -> list[str]:
    request = ExecutionRequest(command=["python3", "-c", "print(1)"], **kwargs)  # type: ignore[arg-type]
    return bwrap_args(LAYOUT, request, LIMITS, Fds(seccomp=5, info=6, block=7))


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def test_every_namespace_is_unshared_and_nested_user_namespaces_are_disabled() -> None:
    argv = _argv()
    for flag in (
        "--unshare-user",
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup",
        "--disable-userns",
        "--die-with-parent",
        "--new-session",
    ):
        assert flag in argv
    assert not any(word.endswith("-try") for word in argv), "no best-effort namespaces"
    assert "--share-net" not in argv


def test_the_root_is_built_then_made_read_only() -> None:
    argv = _argv()
    assert argv[argv.index("--tmpfs") + 1] == "/"
    assert argv[argv.index("--ro-bind") :][:3] == ["--ro-bind", "/usr", "/usr"]
    assert argv[argv.index("--symlink") :][:3] == ["--symlink", "usr/bin", "/bin"]
    remounts = _pairs(argv, "--remount-ro")
    assert remounts[-1] == "/" and "/dev" in remounts
    assert argv.index("--remount-ro") > argv.index("--ro-bind")


def test_writable_places_are_size_limited_tmpfs() -> None:
    argv = _argv()
    assert set(_pairs(argv, "--tmpfs")) == {"/", "/dev/shm", "/tmp", WORKSPACE}
    assert _pairs(argv, "--size") == [str(8 << 20)] * 3
    for target in ("/dev/shm", "/tmp", WORKSPACE):
        i = argv.index(target)
        assert argv[i - 3 : i - 1] == ["--size", str(8 << 20)]


def test_the_user_is_uid_1000_and_the_fds_are_passed() -> None:
    argv = _argv()
    assert _pairs(argv, "--uid") == ["1000"] and _pairs(argv, "--gid") == ["1000"]
    assert _pairs(argv, "--seccomp") == ["5"]
    assert _pairs(argv, "--info-fd") == ["6"] and _pairs(argv, "--block-fd") == ["7"]
    assert "--" not in argv and "python3" not in argv, "the command is not an option"


def test_the_environment_is_set_inside_only_never_inherited() -> None:
    argv = _argv(env={"LD_PRELOAD": "/x.so", "TOKEN": "secret"})
    start = argv.index("--clearenv")
    assert start > argv.index("--seccomp")
    setenv = argv[start + 1 :]
    assert setenv[:3] == ["--setenv", "PATH", sandbox_env({})["PATH"]]
    pairs = dict(zip(setenv[1::3], setenv[2::3], strict=True))
    assert pairs["LD_PRELOAD"] == "/x.so" and pairs["TOKEN"] == "secret"
    assert LAUNCH_ENV == {}, "bwrap and setpriv run with an empty environment"


def test_arguments_are_packed_nul_terminated() -> None:
    assert pack_args(["--bind", "a b", ""]) == b"--bind\0a b\0\0"


def test_without_fds_for_info_and_block_none_are_passed() -> None:
    request = ExecutionRequest(command=["true"])
    argv = bwrap_args(LAYOUT, request, LIMITS, Fds(seccomp=3))
    assert "--info-fd" not in argv and "--block-fd" not in argv


def test_mounts_are_read_only_unless_writable_and_come_after_the_workspace() -> None:
    argv = _argv(mounts=[Mount.parse("/data:/home/user/data"), Mount.parse("/out:/out:rw")])
    assert argv[argv.index("/data") - 1] == "--ro-bind"
    assert argv[argv.index("/out") - 1] == "--bind"
    assert argv.index("/data") > argv.index(WORKSPACE)


def test_cwd_defaults_to_the_workspace() -> None:
    assert _pairs(_argv(), "--chdir") == [WORKSPACE]
    assert _pairs(_argv(cwd="/tmp"), "--chdir") == ["/tmp"]


def test_the_environment_is_the_defaults_overridden_by_the_request() -> None:
    env = sandbox_env({"PATH": "/bin", "API": "x"})
    assert env["PATH"] == "/bin" and env["API"] == "x" and env["HOME"] == WORKSPACE
    assert set(sandbox_env({})) == {
        "PATH",
        "HOME",
        "USER",
        "LOGNAME",
        "LANG",
        "TERM",
        "PIP_BREAK_SYSTEM_PACKAGES",
    }


WRITABLE = Writable(
    workspace="/vol/workspace",
    tmp="/vol/tmp",
    overlays={"/usr": Overlay("/vol/lower/usr", "/vol/layers/usr/upper", "/vol/layers/usr/work")},
)


def _volume_argv() -> list[str]:
    request = ExecutionRequest(command=["true"])
    return bwrap_args(LAYOUT, request, LIMITS, Fds(seccomp=5), writable=WRITABLE)


def test_with_a_volume_the_overlaid_directories_are_overlays_of_its_layers() -> None:
    argv = _volume_argv()
    at = argv.index("--overlay-src")
    assert argv[at : at + 6] == [
        "--overlay-src", "/vol/lower/usr",
        "--overlay", "/vol/layers/usr/upper", "/vol/layers/usr/work", "/usr",
    ]  # fmt: skip
    assert "/usr" not in _pairs(argv, "--ro-bind"), "never the template itself, writable"
    assert argv[argv.index("--symlink") :][:3] == ["--symlink", "usr/bin", "/bin"]
    assert _pairs(argv, "--remount-ro")[-1] == "/", "the root's own tmpfs stays read-only"


def test_with_a_volume_the_workspace_and_tmp_are_its_directories_and_shm_stays_tmpfs() -> None:
    argv = _volume_argv()
    assert _pairs(argv, "--bind") == ["/vol/tmp", "/vol/workspace"]
    assert argv[argv.index("/vol/workspace") + 1] == WORKSPACE
    assert argv[argv.index("/vol/tmp") + 1] == "/tmp"
    assert set(_pairs(argv, "--tmpfs")) == {"/", "/dev/shm"}
    assert _pairs(argv, "--size") == [str(8 << 20)], "/dev/shm keeps its own limit"


def test_tenants_volumes_are_bound_after_the_workspace_read_only_when_asked() -> None:
    shared = (("/vol/shared/0", "/home/user/data", False), ("/vol/shared/1", "/mnt/ro", True))
    writable = dataclasses.replace(WRITABLE, shared=shared)
    argv = bwrap_args(LAYOUT, ExecutionRequest(command=["true"]), LIMITS, Fds(5), None, writable)
    at = argv.index("/vol/shared/0")
    assert argv[at - 1 : at + 2] == ["--bind", "/vol/shared/0", "/home/user/data"]
    assert argv.index("/vol/workspace") < at, "a volume under the workspace is not hidden by it"
    at = argv.index("/vol/shared/1")
    assert argv[at - 1 : at + 2] == ["--ro-bind", "/vol/shared/1", "/mnt/ro"]
    root_inside = bwrap_args(LAYOUT, ExecutionRequest(command=["true"]), LIMITS,
                             Fds(5, info=6, userns_block=7), None, writable)  # fmt: skip
    made = _pairs(root_inside, "--dir")
    assert "/mnt" in made and root_inside.index("/mnt") < root_inside.index("/vol/shared/1")


def test_a_directory_without_layers_stays_a_read_only_bind() -> None:
    layout = (*LAYOUT, Entry(Kind.RO_BIND, "/opt", "/opt"))
    argv = bwrap_args(layout, ExecutionRequest(command=["true"]), LIMITS, Fds(5), None, WRITABLE)
    assert _pairs(argv, "--ro-bind") == ["/opt"]
    assert _pairs(argv, "--overlay-src") == ["/vol/lower/usr"]

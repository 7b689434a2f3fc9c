import json

import pytest
from pydantic import ValidationError

from ringfence.models import (
    ExecutionRequest,
    ExecutionResult,
    Mount,
    ResourceLimits,
    Status,
    advance,
)


def _fields_in_error(exc: pytest.ExceptionInfo[ValidationError]) -> set[str]:
    return {".".join(str(p) for p in e["loc"]) for e in exc.value.errors()}


def test_a_request_needs_a_command() -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(command=[])
    assert "command" in _fields_in_error(exc)


def test_ids_are_generated_unique_and_validated() -> None:
    assert ExecutionRequest(command=["true"]).id != ExecutionRequest(command=["true"]).id
    for bad in ["", "../x", "a b", "x" * 64, "-leading"]:
        with pytest.raises(ValidationError):
            ExecutionRequest(id=bad, command=["true"])


@pytest.mark.parametrize("name", ["1ABC", "A-B", "", "A B", "A=B"])
def test_invalid_environment_names_are_refused(name: str) -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest(command=["true"], env={name: "x"})
    assert {field.split(".")[0] for field in _fields_in_error(exc)} == {"env"}


def test_nul_bytes_are_refused_everywhere() -> None:
    for kwargs in [
        {"command": ["a\0b"]},
        {"command": ["true"], "args": ["\0"]},
        {"command": ["true"], "env": {"A": "\0"}},
    ]:
        with pytest.raises(ValidationError):
            ExecutionRequest(**kwargs)


@pytest.mark.parametrize("timeout", [0, -1, 10**9])
def test_timeout_must_be_positive_and_bounded(timeout: float) -> None:
    with pytest.raises(ValidationError):
        ExecutionRequest(command=["true"], timeout=timeout)


def test_relative_cwd_is_refused() -> None:
    with pytest.raises(ValidationError):
        ExecutionRequest(command=["true"], cwd="work")


def test_limits_accept_sizes_as_text_and_check_bounds() -> None:
    limits = ResourceLimits(memory="256M", disk="8M", pids=10, cpus=0.5)
    assert limits.memory == 256 << 20 and limits.disk == 8 << 20
    with pytest.raises(ValidationError):
        ResourceLimits(memory="1K")  # below the 4 MiB floor
    with pytest.raises(ValidationError):
        ResourceLimits(pids=0)
    with pytest.raises(ValidationError):
        ResourceLimits(cpus=0)
    with pytest.raises(ValidationError):
        ResourceLimits(memory="lots")


def test_limits_merge_over_defaults_field_by_field() -> None:
    defaults = ResourceLimits(memory=512 << 20, pids=256, cpus=1.0, disk=256 << 20)
    merged = ResourceLimits(pids=8).merged_over(defaults)
    assert merged == ResourceLimits(memory=512 << 20, pids=8, cpus=1.0, disk=256 << 20)


@pytest.mark.parametrize("target", ["/", "/proc", "/proc/self", "/dev/null", "/sys"])
def test_mounts_cannot_cover_the_sandbox_plumbing(target: str) -> None:
    with pytest.raises(ValidationError):
        Mount(source="/tmp", target=target)


@pytest.mark.parametrize("path", ["relative", "/a/../b", "/a\0"])
def test_mount_paths_must_be_absolute_and_plain(path: str) -> None:
    with pytest.raises(ValidationError):
        Mount(source=path, target="/data")
    with pytest.raises(ValidationError):
        Mount(source="/data", target=path)


def test_mount_parse_reads_the_cli_form() -> None:
    assert Mount.parse("/src:/dst") == Mount(source="/src", target="/dst", writable=False)
    assert Mount.parse("/src:/dst:rw").writable
    assert not Mount.parse("/src:/dst:ro").writable
    for bad in ["/src", "/src:/dst:rx", "/a:/b:/c:rw"]:
        with pytest.raises(ValueError):
            Mount.parse(bad)


def test_two_mounts_on_one_target_are_refused() -> None:
    with pytest.raises(ValidationError):
        ExecutionRequest(
            command=["true"],
            mounts=[Mount(source="/a", target="/x"), Mount(source="/b", target="/x/")],
        )


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValidationError) as exc:
        ExecutionRequest.model_validate({"command": ["true"], "comand": ["x"]})
    assert "comand" in _fields_in_error(exc)


def test_requests_and_results_round_trip_through_json() -> None:
    request = ExecutionRequest(
        command=["sh", "-c"],
        args=["echo hi"],
        env={"A": "1"},
        timeout=5,
        limits=ResourceLimits(memory="64M"),
        mounts=[Mount.parse("/a:/b:rw")],
        session_id="s",
        task_id="t",
        checkpoint_id="c",
        approved_by="alice",
    )
    assert ExecutionRequest.model_validate_json(request.model_dump_json()) == request
    assert request.argv == ["sh", "-c", "echo hi"]
    result = ExecutionResult(execution_id="x", status=Status.TIMED_OUT, error="timed out")
    data = json.loads(result.model_dump_json())
    assert data["status"] == "timed_out"
    assert ExecutionResult.model_validate(data) == result


def test_status_strings_are_stable_api() -> None:
    assert [s.value for s in Status] == [
        "pending",
        "running",
        "succeeded",
        "failed",
        "timed_out",
        "cancelled",
    ]


def test_legal_transitions_follow_the_lifecycle() -> None:
    assert advance(Status.PENDING, Status.RUNNING) is Status.RUNNING
    assert advance(Status.PENDING, Status.FAILED) is Status.FAILED
    for end in (Status.SUCCEEDED, Status.FAILED, Status.TIMED_OUT, Status.CANCELLED):
        assert advance(Status.RUNNING, end) is end
        assert end.is_terminal


@pytest.mark.parametrize(
    ("current", "new"),
    [
        (Status.SUCCEEDED, Status.RUNNING),
        (Status.CANCELLED, Status.FAILED),
        (Status.PENDING, Status.SUCCEEDED),
        (Status.RUNNING, Status.PENDING),
        (Status.RUNNING, Status.RUNNING),
    ],
)
def test_illegal_transitions_are_refused(current: Status, new: Status) -> None:
    with pytest.raises(ValueError):
        advance(current, new)

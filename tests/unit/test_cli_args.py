from click.testing import CliRunner

from ringfence.cli import main
from ringfence.cli.exec_cmd import exit_code_for
from ringfence.models import ExecutionResult, Status


def _invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.output


def test_bad_limits_are_usage_errors_naming_the_field() -> None:
    code, output = _invoke("exec", "--memory", "12X", "--", "true")
    assert code == 2 and "memory" in output
    code, output = _invoke("exec", "--pids", "0", "--", "true")
    assert code == 2 and "pids" in output


def test_bad_mounts_and_env_are_usage_errors() -> None:
    code, output = _invoke("exec", "--mount", "relative:/x", "--", "true")
    assert code == 2 and "absolute" in output
    code, output = _invoke("exec", "--env", "NO_SUCH_VARIABLE_HERE_123", "--", "true")
    assert code == 2 and "NO_SUCH_VARIABLE_HERE_123" in output


def test_an_unknown_backend_is_a_usage_error() -> None:
    code, output = _invoke("exec", "--backend", "docker", "--", "true")
    assert code == 2 and "local" in output and "process" in output


def test_a_command_is_required() -> None:
    code, _ = _invoke("exec")
    assert code == 2


def test_exit_codes_follow_timeout_1_conventions() -> None:
    def result(status: Status, exit_code: int | None = None) -> ExecutionResult:
        return ExecutionResult(execution_id="x", status=status, exit_code=exit_code)

    assert exit_code_for(result(Status.SUCCEEDED, 0)) == 0
    assert exit_code_for(result(Status.FAILED, 3)) == 3
    assert exit_code_for(result(Status.FAILED, 137)) == 137
    assert exit_code_for(result(Status.TIMED_OUT)) == 124
    assert exit_code_for(result(Status.FAILED)) == 125
    assert exit_code_for(result(Status.CANCELLED)) == 130
    assert exit_code_for(result(Status.FAILED, -11)) == 125

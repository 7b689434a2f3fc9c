from ringfence.backends.local import LocalExecutor
from ringfence.models import ExecutionRequest, Status


async def test_python_prints_one(local_executor: LocalExecutor) -> None:
    result = await local_executor.execute(ExecutionRequest(command=["python3", "-c", "print(1)"]))
    assert result.status is Status.SUCCEEDED
    assert result.exit_code == 0
    assert result.logs == "1\n"

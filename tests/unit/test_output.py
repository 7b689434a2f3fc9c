from ringfence.backends._output import BoundedLog


def test_small_output_is_kept_whole() -> None:
    log = BoundedLog(100)
    log.write(b"hello ")
    log.write(b"world\n")
    assert log.text() == "hello world\n"
    assert not log.truncated


def test_large_output_keeps_head_and_tail_with_a_marker() -> None:
    log = BoundedLog(1000)
    log.write(b"START" + b"x" * 10_000)
    for _ in range(100):
        log.write(b"y" * 997)
    log.write(b"THE END")
    text = log.text()
    assert text.startswith("START")
    assert text.endswith("THE END")
    assert log.truncated
    kept = len(text.encode()) - len(f"\n[ringfence: {log.dropped} bytes of output cut here]\n")
    assert kept == 1000
    assert f"[ringfence: {log.dropped} bytes of output cut here]" in text
    assert log.dropped == 5 + 10_000 + 99_700 + 7 - 1000


def test_memory_stays_bounded_however_much_is_written() -> None:
    log = BoundedLog(4096)
    for _ in range(10_000):
        log.write(b"z" * 1000)
    assert len(log._head) + log._tail_size <= 4096


def test_invalid_utf8_is_replaced_not_fatal() -> None:
    log = BoundedLog(100)
    log.write(b"\xff\xfeok")
    assert log.text().endswith("ok")

import pytest

from ringfence._units import format_size, parse_size


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("1k", 1024),
        ("256M", 256 << 20),
        ("1.5G", 3 << 29),
        ("2GiB", 2 << 30),
        ("64mb", 64 << 20),
        (" 3 T ", 3 << 40),
        (0, 0),
        (4096, 4096),
    ],
)
def test_parse_size_accepts_binary_suffixes(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "12X", "M", "-1", "1..2M", True, -5])
def test_parse_size_rejects_nonsense(bad: str | int) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


def test_format_size_is_the_shortest_exact_form() -> None:
    assert format_size(256 << 20) == "256M"
    assert format_size(1 << 30) == "1G"
    assert format_size(1000) == "1000"
    assert format_size(0) == "0"

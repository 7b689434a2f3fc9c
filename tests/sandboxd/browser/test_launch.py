"""Chromium's command line, without starting it."""

from __future__ import annotations

from ringfence.sandboxd.browser._chromium import FLAGS, argv, proxy_from


def test_the_command_line_is_headless_piped_and_bound_to_loopback() -> None:
    args = argv("/usr/bin/chromium", "/tmp/rf-chromium-x", 49991, "http://127.0.0.1:3128")
    assert args[0] == "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--remote-debugging-pipe",
        "--remote-debugging-address=127.0.0.1",
        "--disable-background-networking",
    ):
        assert flag in args  # fmt: skip
    assert "--remote-debugging-port=49991" in args
    assert "--user-data-dir=/tmp/rf-chromium-x" in args
    assert "--proxy-server=http://127.0.0.1:3128" in args
    assert set(FLAGS) <= set(args)


def test_without_a_proxy_there_is_no_proxy_flag() -> None:
    args = argv("/usr/bin/chromium", "/tmp/p", 0, None)
    assert not [a for a in args if a.startswith("--proxy-server")]


def test_the_proxy_comes_from_https_proxy_first() -> None:
    assert proxy_from({"HTTP_PROXY": "http://a:1", "HTTPS_PROXY": "http://b:2"}) == "http://b:2"
    assert proxy_from({"http_proxy": "http://a:1"}) == "http://a:1"
    assert proxy_from({"HTTPS_PROXY": " "}) is None
    assert proxy_from({}) is None

"""sandboxd: the daemon inside each interactive sandbox, speaking E2B's envd protocol.

It is the only thing that starts processes or touches files in the sandbox. It is standard
library only and imports nothing of ``ringfence``: the host bind-mounts this directory
read-only into the sandbox and runs it with the template's own ``python3`` (3.9 or newer).

Starting it
    The host creates, binds and listens on an AF_UNIX SOCK_STREAM socket, lets the daemon
    inherit it, and runs one of::

        python3 -I -S -B -c "import sys; sys.path.insert(0, '/run/ringfence'); \\
            import sandboxd.__main__" --listen-fd N [--user user]
        python3 -I -S -B /run/ringfence/sandboxd/__main__.py --listen-fd N [--user user]

    ``-S`` skips ``site`` (faster, smaller); ``-B`` because the mount is read-only. The
    daemon never binds anything. ``--user`` names the sandbox's one user (default ``user``):
    requests for any other user (``Authorization: Basic base64("root:")`` or
    ``?username=root``) get ``permission_denied``. The daemon's own environment is the base
    environment of every process it starts; ``HOME`` (default ``/home/user``) is the default
    working directory and the base of relative paths. Its cwd does not matter. It runs
    until killed; SIGTERM or SIGKILL are both fine (it keeps no state worth saving).

Wire protocol
    HTTP/1.1 on the socket: ``GET /health`` (204); Connect RPC with the JSON codec at
    ``POST /process.Process/*`` and ``POST /filesystem.Filesystem/*``; ``GET /files`` and
    ``POST|PUT /files`` (application/octet-stream, optionally gzip; multipart is the host's
    job: it answers 415); ``GET /ports/{port}`` with ``Upgrade: ringfence-tcp``, a byte
    pipe to that port on the sandbox's loopback (preview URLs, groups). See
    ``_process_rpc``, ``_files``, ``_watch``, ``_filehttp`` and ``_tunnel``.
    ``methods`` lists the RPC methods (and which change the sandbox) and the one-user
    rule: the one module the host imports, so both sides read one table.

Memory
    Idle, only the HTTP layer is imported (no asyncio, threading, json, re, socket, typing
    or subprocess: their C cores ``_thread``, ``_json``, ``_socket`` and ``os.fork`` do the
    work). Each service module loads on its first call; ``ctypes`` only for a file watch.
"""

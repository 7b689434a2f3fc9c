"""A small web server that a sandbox runs (standard library only: any python3 has it).

``python3 port_app.py PORT`` listens on 127.0.0.1:PORT (0: any) and prints ``listening N``.

- ``GET|POST /echo...``: JSON of the method, path, headers and body it was sent, and the
  port of the connection it came on (``peer``); with ``drop`` in it, the connection is
  then closed without a word;
- ``GET /stream``: ``one\\n``, then ``two\\n`` once the file ``$PORT_APP_GO`` exists
  (default ``/tmp/port_app.go``; at once with ``?now``), chunked: a streamed answer;
- ``GET /ws``: a WebSocket that answers each text message ``echo:<message>`` and each
  binary one with its bytes reversed, and closes with the code it was sent.
"""

import base64
import hashlib
import json
import os
import struct
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def _body(self):
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        return self.rfile.read(int(self.headers.get("content-length") or 0))

    def _echo(self, body):
        data = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": [[k.lower(), v] for k, v in self.headers.items()],
                "body": body.decode("utf-8", "replace"),
                "peer": self.client_address[1],  # which connection it came on
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Set-Cookie", "app=1; Path=/")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if "drop" in self.path:  # then close, without saying so (a keep-alive timeout)
            self.close_connection = True

    def do_GET(self):
        if self.path.startswith("/ws"):
            self._websocket()
        elif self.path.startswith("/stream"):
            self._stream()
        else:
            self._echo(b"")

    def do_POST(self):
        self._echo(self._body())

    def _stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.write(b"4\r\none\n\r\n")
        self.wfile.flush()
        deadline = time.monotonic() + 30
        go = os.environ.get("PORT_APP_GO", "/tmp/port_app.go")
        while "now" not in self.path and not os.path.exists(go):
            if time.monotonic() > deadline:
                break
            time.sleep(0.01)
        self.wfile.write(b"4\r\ntwo\n\r\n0\r\n\r\n")
        self.wfile.flush()

    def _websocket(self):
        key = self.headers.get("sec-websocket-key", "")
        accept = base64.b64encode(hashlib.sha1((key + _GUID).encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        while True:
            head = self.rfile.read(2)
            if len(head) < 2:
                return
            opcode, length = head[0] & 0x0F, head[1] & 0x7F
            if length == 126:
                length = struct.unpack(">H", self.rfile.read(2))[0]
            elif length == 127:
                length = struct.unpack(">Q", self.rfile.read(8))[0]
            mask = self.rfile.read(4) if head[1] & 0x80 else b"\0\0\0\0"
            payload = bytes(b ^ mask[i % 4] for i, b in enumerate(self.rfile.read(length)))
            if opcode == 8:
                self._frame(8, payload[:2])
                return
            if opcode == 1:
                self._frame(1, b"echo:" + payload)
            elif opcode == 2:
                self._frame(2, payload[::-1])

    def _frame(self, opcode, payload):
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([n])
        elif n < 65536:
            head += bytes([126]) + struct.pack(">H", n)
        else:
            head += bytes([127]) + struct.pack(">Q", n)
        self.wfile.write(head + payload)
        self.wfile.flush()


def main():
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("listening", server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()

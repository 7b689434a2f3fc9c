// A JavaScript code context: a persistent vm context, one node process per context.
//
// Run by the daemon as `node _kernel.js` with fd 3 a socket to the daemon and fds 1 and 2
// pipes it reads as the cell's output; the same JSON lines as the Python kernel (_kernel.py):
//   -> {"code": "...", "env": {...}}
//   <- {"type": "result", "text": "2", "is_main_result": true}
//   <- {"type": "error", "name": "TypeError", "value": "...", "traceback": "..."}
//   <- {"type": "done", "execution_count": 3}
// Top-level declarations persist between cells; a promise as the last value is awaited.
// SIGINT interrupts the running cell (breakOnSigint) and keeps the context.
"use strict";
const net = require("net");
const util = require("util");
const vm = require("vm");

const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const send = (message) => channel.write(JSON.stringify(message) + "\n");
const sandbox = { console, require, process, setTimeout, clearTimeout, setInterval,
                  clearInterval, Buffer, URL, TextEncoder, TextDecoder };
sandbox.display = (...values) => values.forEach((value) =>
  send({ type: "result", text: util.inspect(value), is_main_result: false }));
const context = vm.createContext(sandbox);
let count = 0;
let queue = Promise.resolve();

process.on("SIGINT", () => {}); // outside a cell: ignored; inside: breakOnSigint throws

async function run(code, env) {
  count += 1;
  const saved = {};
  for (const [name, value] of Object.entries(env)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  try {
    let value = vm.runInContext(code, context, { filename: `<cell-${count}>`, breakOnSigint: true });
    if (value && typeof value.then === "function") value = await value;
    if (value !== undefined) {
      send({ type: "result", text: typeof value === "string" ? value : util.inspect(value),
             is_main_result: true });
    }
  } catch (error) {
    const name = error && error.name ? error.name : "Error";
    const value = error && error.message !== undefined ? String(error.message) : String(error);
    send({ type: "error", name, value, traceback: error && error.stack ? String(error.stack) : "" });
  } finally {
    for (const [name, value] of Object.entries(saved)) {
      if (value === undefined) delete process.env[name]; else process.env[name] = value;
    }
  }
  send({ type: "done", execution_count: count });
}

let buffer = "";
channel.on("data", (chunk) => {
  buffer += chunk.toString("utf8");
  let newline;
  while ((newline = buffer.indexOf("\n")) >= 0) {
    const line = buffer.slice(0, newline);
    buffer = buffer.slice(newline + 1);
    let request;
    try {
      request = JSON.parse(line);
    } catch (error) {
      send({ type: "error", name: "RequestError", value: String(error), traceback: "" });
      send({ type: "done", execution_count: count });
      continue;
    }
    queue = queue.then(() => run(String(request.code), request.env || {}));
  }
});
channel.on("end", () => process.exit(0));

// A JavaScript code context: one node process per context, its cells evaluated by node's
// own REPL evaluator, so that top-level `await` works as in E2B's JavaScript kernel (node
// rewrites such a cell, keeping its declarations for the next cells) and ES module
// `import` statements too (rewritten below to dynamic imports, resolved from the context's
// working directory).
//
// Run by the daemon as `node _kernel.js` with fd 3 a socket to the daemon and fds 1 and 2
// pipes it reads as the cell's output; the same JSON lines as the Python kernel (_kernel.py):
//   -> {"code": "...", "env": {...}}
//   <- {"type": "result", "text": "2", "is_main_result": true}
//   <- {"type": "error", "name": "TypeError", "value": "...", "traceback": "..."}
//   <- {"type": "done", "execution_count": 3}
// Top-level declarations persist between cells; a promise as the last value is awaited.
// SIGINT interrupts a running cell's synchronous code and keeps the context, except in a
// cell with top-level `await` (or `import`), which the daemon restarts if it will not stop.
// An error thrown later (a timer's) goes to stderr; it does not end the context.
"use strict";
const net = require("net");
const repl = require("repl");
const util = require("util");
const vm = require("vm");
const { PassThrough, Writable } = require("stream");

const channel = new net.Socket({ fd: 3, readable: true, writable: true });
const send = (message) => channel.write(JSON.stringify(message) + "\n");

// What the REPL writes itself is an error report: a cell's is sent as its error, so only
// one from outside a cell (a timer's, a rejected promise's) reaches stderr.
let finish = null; // the running cell's completion, while one runs
const reports = new Writable({
  write(chunk, _encoding, done) {
    if (finish === null) process.stderr.write(chunk);
    done();
  },
});
const server = repl.start({
  input: new PassThrough(), output: reports, prompt: "", terminal: false,
  useGlobal: false, breakEvalOnSigint: false, preview: false,
});
server.context.console = console; // the cell's console.log is its stdout
server.context.display = (...values) => values.forEach((value) =>
  send({ type: "result", text: util.inspect(value), is_main_result: false }));
// An error thrown while a cell runs reaches the REPL's domain, which reports it and shows
// the prompt instead of calling the evaluation back: that is the cell's end too.
server.displayPrompt = () => {
  if (finish !== null) finish(server.lastError, undefined);
};

process.on("SIGINT", () => {}); // outside a cell: ignored; inside: breakOnSigint throws
// An error thrown later, outside any cell (a timer's), is reported; the context lives on.
const later = (error) => process.stderr.write(`Uncaught ${util.inspect(error)}\n`);
process.on("uncaughtException", later);
process.on("unhandledRejection", later);

// `import x from "m"`, `import {a as b} from "m"`, `import * as m from "m"`, `import "m"`
// at the start of a line become `var ... = await import("m")` (var: a cell re-run imports
// again instead of failing on a redeclared binding).
const IMPORT = /^([ \t]*)import\s+(?:([\w$]+)\s*,?\s*)?(?:\*\s*as\s+([\w$]+)|\{([^}]*)\})?\s*(?:from\s*)?(["'][^"'\n]+["'])[ \t]*;?/gm;

function dynamicImports(code) {
  return code.replace(IMPORT, (_all, indent, byDefault, namespace, named, source) => {
    const load = `await import(${source})`;
    if (namespace) {
      const alias = byDefault ? `; var ${byDefault} = ${namespace}.default` : "";
      return `${indent}var ${namespace} = ${load}${alias};`;
    }
    const fields = [];
    if (byDefault) fields.push(`default: ${byDefault}`);
    for (const part of (named || "").split(",").map((p) => p.trim()).filter(Boolean)) {
      const [name, alias] = part.split(/\s+as\s+/);
      fields.push(alias ? `${name}: ${alias}` : name);
    }
    return fields.length ? `${indent}var { ${fields.join(", ")} } = ${load};` : `${indent}${load};`;
  });
}

// A cell that compiles as a script runs as one (SIGINT breaks it); one that does not only
// for its top-level `await` goes to the REPL's evaluator, which rewrites it (its lexical
// declarations land in the context's global scope, shared by every script run in it).
function evaluate(code) {
  const filename = `<cell-${count}>`;
  let script;
  try {
    script = new vm.Script(code, { filename });
  } catch (error) {
    if (!(error instanceof SyntaxError) || !/\bawait\b/.test(code)) return Promise.resolve([error]);
    return awaited(code, filename);
  }
  try {
    return Promise.resolve([null, script.runInContext(server.context, { breakOnSigint: true })]);
  } catch (error) {
    return Promise.resolve([error]);
  }
}

function awaited(code, filename) {
  return new Promise((resolve) => {
    finish = (error, value) => {
      finish = null;
      resolve([error, value]);
    };
    server.lastError = undefined;
    server.eval(code, server.context, filename, (error, value) => {
      if (finish !== null) finish(error, value);
    });
  });
}

function described(error) {
  if (error instanceof repl.Recoverable) error = error.err; // incomplete input
  const name = error && error.name ? error.name : "Error";
  const value = error && error.message !== undefined ? String(error.message) : String(error);
  const stack = error && error.stack ? String(error.stack) : "";
  // the cell's frames, not the REPL's and this kernel's
  const traceback = stack.split("\n").filter((line) =>
    !/\((node:|.*_kernel\.js)|at (node:|.*_kernel\.js)|node:domain|node:repl|node:vm/.test(line)
  ).join("\n");
  return { type: "error", name, value, traceback };
}

let count = 0;
let queue = Promise.resolve();

async function run(code, env) {
  count += 1;
  const saved = {};
  for (const [name, value] of Object.entries(env)) {
    saved[name] = process.env[name];
    process.env[name] = value;
  }
  try {
    let [error, value] = await evaluate(dynamicImports(code));
    if (!error && value && typeof value.then === "function") {
      try {
        value = await value;
      } catch (rejection) {
        error = rejection;
      }
    }
    if (error) {
      send(described(error));
    } else if (value !== undefined) {
      send({ type: "result", text: typeof value === "string" ? value : util.inspect(value),
             is_main_result: true });
    }
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

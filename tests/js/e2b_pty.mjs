// sandbox.pty through the official E2B JavaScript SDK, unmodified: create with a size and
// onData, sendInput, resize, connect (a second watcher), kill, and the exit code at the end.
// Prints one JSON line of what it saw; tests/e2b/test_pty.py runs it and checks that line.
import { Sandbox } from 'e2b'

const seen = {}
const encoder = new TextEncoder()
const decoder = new TextDecoder()

// Resolves once `text` holds `needle` (onData appends to it), or fails after 30 s.
const until = async (read, needle) => {
  const deadline = Date.now() + 30_000
  while (!read().includes(needle)) {
    if (Date.now() > deadline) throw new Error(`never saw ${needle}: ${read()}`)
    await new Promise((resolve) => setTimeout(resolve, 10))
  }
}

const sbx = await Sandbox.create({ timeoutMs: 120_000 })
try {
  let text = ''
  const terminal = await sbx.pty.create({
    rows: 24, cols: 80, cwd: '/tmp', envs: { MINE: 'js' },
    onData: (data) => { text += decoder.decode(data) },
  })
  await sbx.pty.sendInput(terminal.pid, encoder.encode('echo "=$((6*7))= $(id -u) $(pwd) $MINE $TERM =$((7*8))="\n'))
  await until(() => text, '=56=')
  seen.answer = text.match(/=42= (\S+ \S+ \S+ \S+) =56=/)[1]
  await sbx.pty.sendInput(terminal.pid, encoder.encode('stty size\n'))
  await until(() => text, '24 80\r\n')
  await sbx.pty.resize(terminal.pid, { rows: 50, cols: 160 })
  await sbx.pty.sendInput(terminal.pid, encoder.encode('stty size\n'))
  await until(() => text, '50 160\r\n')
  seen.resized = true

  let other = ''
  const watcher = await sbx.pty.connect(terminal.pid, { onData: (data) => { other += decoder.decode(data) } })
  await sbx.pty.sendInput(terminal.pid, encoder.encode('echo both-$((5+5))\n'))
  await until(() => other, 'both-10')
  await until(() => text, 'both-10')
  seen.watched = true
  await sbx.pty.sendInput(terminal.pid, encoder.encode('exit 4\n'))
  try {
    await terminal.wait()
  } catch (err) {
    seen.exit = `${err.name}:${err.exitCode}`
  }
  await watcher.wait().catch(() => {})

  const killed = await sbx.pty.create({ rows: 24, cols: 80, onData: () => {}, timeoutMs: 0 })
  seen.killed = await sbx.pty.kill(killed.pid)
  await killed.wait().catch(() => {})
  seen.killedAgain = await sbx.pty.kill(killed.pid)
} finally {
  await sbx.kill()
}
console.log(JSON.stringify(seen))

// The official E2B JavaScript SDKs, unmodified, against Ringfence: E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point them at it. Prints one JSON line of what it saw;
// tests/e2b/test_js.py runs it with the machine's node and checks that line.
import { Sandbox } from 'e2b'
import { Sandbox as CodeSandbox } from '@e2b/code-interpreter'

const seen = {}

const sbx = await Sandbox.create({ timeoutMs: 120_000, metadata: { from: 'js' } })
try {
  const ran = await sbx.commands.run('echo hello from js; echo oops >&2')
  seen.stdout = ran.stdout
  seen.stderr = ran.stderr
  seen.exitCode = ran.exitCode
  try {
    await sbx.commands.run('exit 3')
  } catch (err) {
    seen.exitError = `${err.name}:${err.exitCode}`
  }
  await sbx.files.write('/home/user/js.txt', 'written by js')
  seen.read = await sbx.files.read('/home/user/js.txt')
  seen.listed = (await sbx.files.list('/home/user')).map((entry) => entry.name)
  seen.info = (await sbx.getInfo()).metadata

  // files, as envd keeps them
  await sbx.files.makeDir('/home/user/tree/a')
  await sbx.files.write('/home/user/tree/b.txt', 'b')
  await sbx.files.write('/home/user/tree/a/z.txt', 'z')
  seen.deep = (await sbx.files.list('/home/user/tree', { depth: 2 }))
    .map((entry) => entry.path.replace('/home/user/tree/', ''))
  const written = await sbx.files.write('/home/user/meta.txt', 'm', { metadata: { Who: 'js' } })
  seen.writeMetadata = written.metadata
  seen.infoMetadata = (await sbx.files.getInfo('/home/user/meta.txt')).metadata
  await sbx.files.remove('/home/user/never-there')
  seen.exists = [await sbx.files.exists('/home/user/meta.txt'), await sbx.files.exists('/home/user/nope')]
  seen.renamed = (await sbx.files.rename('/home/user/meta.txt', '/home/user/meta2.txt')).path
  const events = []
  const watcher = await sbx.files.watchDir('/home/user/tree', (event) => {
    events.push(`${event.name}:${event.type}`)
  })
  await sbx.files.write('/home/user/tree/b.txt', 'written again')
  for (let i = 0; i < 200 && !events.includes('b.txt:write'); i++) {
    await new Promise((resolve) => setTimeout(resolve, 50))
  }
  await watcher.stop()
  seen.watched = [...new Set(events)].sort()

  // commands: a timeout, a background command listed and killed
  try {
    await sbx.commands.run('sleep 30', { timeoutMs: 1000 })
  } catch (err) {
    seen.timeoutError = err.name
  }
  const background = await sbx.commands.run('sleep 30', { background: true })
  seen.listedPid = (await sbx.commands.list()).some((p) => p.pid === background.pid)
  seen.killedPid = await background.kill()

  // the control plane
  await sbx.setTimeout(200_000)
  seen.connected = (await Sandbox.connect(sbx.sandboxId)).sandboxId === sbx.sandboxId
  const listed = await Sandbox.list({ query: { metadata: { from: 'js' } } }).nextItems()
  seen.listedSandbox = listed.map((s) => s.sandboxId).includes(sbx.sandboxId)
} finally {
  seen.killed = await sbx.kill()
}
seen.runningAfterKill = await sbx.isRunning()

const code = await CodeSandbox.create()
try {
  await code.runCode('x = 20')
  const execution = await code.runCode('x * 2 + 2')
  seen.codeText = execution.text
  seen.codeError = (await code.runCode('1/0')).error?.name
  seen.defaultContexts = (await code.listCodeContexts()).map((c) => c.language).sort()
  const lines = []
  await code.runCode('print(1)', { onStdout: (out) => lines.push(out.line) })
  seen.wholeLines = lines
  const js = await code.createCodeContext({ language: 'javascript' })
  const esm = await code.runCode(
    "import { join } from 'node:path'\nconst v = await Promise.resolve(join('a', 'b'))\nv",
    { context: js },
  )
  seen.esm = esm.text
  const plot = await code.runCode(
    "import matplotlib\nmatplotlib.use('Agg')\nimport matplotlib.pyplot as plt\n" +
    "plt.plot([1, 2], [3, 4]); plt.title('js'); plt.show()",
  )
  seen.chart = [plot.results[0]?.chart?.type, plot.results[0]?.chart?.title]
  const frame = await code.runCode("import pandas as pd\npd.DataFrame({'a': [1, 2]})")
  seen.data = frame.results[0]?.data
  await code.restartCodeContext(js)
  await code.removeCodeContext(js)
  seen.contextsAfterRemove = (await code.listCodeContexts()).length
} finally {
  await code.kill()
}

console.log(JSON.stringify(seen))

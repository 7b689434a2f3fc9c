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
} finally {
  await code.kill()
}

console.log(JSON.stringify(seen))

// The official E2B JavaScript SDK's getMetrics, unmodified, against Ringfence: E2B_API_URL,
// E2B_SANDBOX_URL and E2B_API_KEY point it at it. Prints one JSON line of what it saw;
// tests/e2b/test_js_metrics.py runs it with the machine's node and checks that line.
import { Sandbox } from 'e2b'

const seen = {}
const sbx = await Sandbox.create()
try {
  const first = await sbx.getMetrics()
  seen.first = first.length
  const m = first[0]
  seen.fields = [
    m.timestamp instanceof Date, m.cpuCount >= 1, m.cpuUsedPct >= 0, m.memUsed > 0,
    m.memTotal > 0, m.diskTotal > 0, m.diskUsed >= 0,
  ]
  await sbx.files.write('/home/user/blob.bin', 'x'.repeat(4 << 20))
  const byId = await Sandbox.getMetrics(sbx.sandboxId)
  seen.grew = byId[byId.length - 1].diskUsed >= m.diskUsed + (4 << 20)
  seen.future = (await sbx.getMetrics({ start: new Date(Date.now() + 3600e3) })).length
} finally {
  await sbx.kill()
}
try {
  await Sandbox.getMetrics(sbx.sandboxId)
  seen.afterKill = 'answered'
} catch (err) {
  seen.afterKill = err.name
}
console.log(JSON.stringify(seen))

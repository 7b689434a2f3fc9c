// The official E2B JavaScript SDK's volumes, unmodified, against Ringfence: E2B_API_URL,
// E2B_SANDBOX_URL, E2B_VOLUME_API_URL and E2B_API_KEY point it at it. Prints one JSON line
// of what it saw; tests/e2b/test_js.py runs it with the machine's node and checks that line.
import { Sandbox, Volume } from 'e2b'

const seen = {}
const vol = await Volume.create(`js-${Date.now()}`)
try {
  seen.name = vol.name
  seen.listed = (await Volume.list()).some((v) => v.volumeId === vol.volumeId)
  const written = await vol.writeFile('/js/a.txt', 'from js')
  seen.written = [written.path, written.size, written.uid]
  seen.read = await vol.readFile('/js/a.txt')
  seen.entries = (await vol.list('/js')).map((entry) => entry.name)
  const sbx = await Sandbox.create({ volumeMounts: { '/mnt/data': vol } })
  try {
    seen.inside = (await sbx.commands.run('cat /mnt/data/js/a.txt')).stdout
    await sbx.commands.run('echo from sandbox > /mnt/data/back.txt')
    seen.mounts = (await sbx.getInfo()).volumeMounts
  } finally {
    await sbx.kill()
  }
  seen.back = await vol.readFile('/back.txt')
} finally {
  seen.destroyed = await Volume.destroy(vol.volumeId)
}
console.log(JSON.stringify(seen))

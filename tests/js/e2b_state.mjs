// Sandbox state through the official E2B JavaScript SDK, unmodified: pause, list of paused
// sandboxes, connect's resume, a snapshot created from and deleted, fork({ count: 2 }).
// Prints one JSON line of what it saw; tests/e2b/test_state.py runs it and checks that line.
import { Sandbox } from 'e2b'

const seen = {}
const tag = `js-state-${process.pid}-${Date.now()}`
const listed = async (state) =>
  (await Sandbox.list({ query: { metadata: { tag }, state } }).nextItems()).map((s) => s.state)

const sbx = await Sandbox.create({ timeoutMs: 300_000, metadata: { tag } })
const made = []
try {
  await sbx.files.write('/home/user/kept.txt', 'kept by js')
  seen.paused = await sbx.pause()
  seen.pausedAgain = await sbx.betaPause()
  seen.listedPaused = await listed(['paused'])
  seen.listedRunning = await listed(['running'])
  const again = await Sandbox.connect(sbx.sandboxId)
  seen.readAfterResume = await again.files.read('/home/user/kept.txt')
  seen.stateAfterResume = (await again.getInfo()).state

  const snapshot = await sbx.createSnapshot()
  seen.snapshotListed = (await Sandbox.listSnapshots({ sandboxId: sbx.sandboxId }).nextItems())
    .map((s) => s.snapshotId === snapshot.snapshotId)
  const fromSnapshot = await Sandbox.create(snapshot.snapshotId)
  made.push(fromSnapshot)
  seen.readFromSnapshot = await fromSnapshot.files.read('/home/user/kept.txt')
  seen.deleted = await Sandbox.deleteSnapshot(snapshot.snapshotId)
  seen.deletedAgain = await Sandbox.deleteSnapshot(snapshot.snapshotId)

  const children = await sbx.fork({ count: 2, timeoutMs: 120_000 })
  made.push(...children.filter((child) => !(child instanceof Error)))
  seen.forked = children.map((child) => (child instanceof Error ? child.message : 'sandbox'))
  seen.distinct = new Set([sbx.sandboxId, ...made.slice(1).map((c) => c.sandboxId)]).size
  seen.readInChildren = await Promise.all(made.slice(1).map((c) => c.files.read('/home/user/kept.txt')))
} finally {
  for (const other of made) await other.kill()
  seen.killed = await sbx.kill()
}

console.log(JSON.stringify(seen))

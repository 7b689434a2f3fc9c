// E2B's network options through the official E2B JavaScript SDK, unmodified: allowOut and
// denyOut at create, allowInternetAccess, updateNetwork (the JavaScript SDK spells its switch
// allow_internet_access on the wire), a grant beyond what a key may open, the operator's deny
// rule against allowOut, a header transform. Prints one JSON line of what it saw;
// tests/e2b/test_network.py runs it against its server and origin and checks that line.
import { ALL_TRAFFIC, Sandbox } from 'e2b'

const FETCH = `
import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=20).read().decode(), end="")
except Exception as exc:
    print("refused:", exc)
`
const reaches = async (sbx, name) => {
  const got = (await sbx.commands.run(`python3 -c '${FETCH}' http://${name}/`)).stdout
  if (got !== 'hello from origin' && !got.includes('egress denied by Ringfence')) throw new Error(got)
  return got === 'hello from origin'
}
const refusal = async (call) => {
  try {
    await call()
    return 'granted'
  } catch (error) {
    return `${error.name}:${error.message.match(/(network\.)?(allowOut|denyOut)\[\d\]/)?.[0]}`
  }
}

const seen = {}
const sbx = await Sandbox.create({
  network: {
    allowOut: ['other.test', 'secret.test'],
    denyOut: ({ allTraffic }) => [allTraffic],
    rules: { 'secret.test': [{ transform: { headers: { 'X-Api-Key': process.env.SECRET } } }] },
  },
})
try {
  seen.created = [await reaches(sbx, 'other.test'), await reaches(sbx, 'allowed.test')]
  seen.transformed = await reaches(sbx, 'secret.test')
  await sbx.updateNetwork({ allowOut: ['allowed.test', 'denied.test'], denyOut: [ALL_TRAFFIC] })
  seen.updated = [
    await reaches(sbx, 'other.test'), await reaches(sbx, 'allowed.test'),
    await reaches(sbx, 'denied.test'),
  ]
  await sbx.updateNetwork({ allowInternetAccess: false })
  seen.closed = await reaches(sbx, 'allowed.test')
  seen.beyondCeiling = await refusal(() => sbx.updateNetwork({ allowOut: ['169.254.169.254'] }))
  seen.nameDenied = await refusal(() => sbx.updateNetwork({ denyOut: ['evil.test'] }))
  seen.stillClosed = await reaches(sbx, 'allowed.test')
} finally {
  seen.killed = await sbx.kill()
}
seen.createBeyondCeiling = await refusal(() =>
  Sandbox.create({ network: { allowOut: ['10.1.2.3'], denyOut: [ALL_TRAFFIC] } }))
const internet = await Sandbox.create({ allowInternetAccess: true })
try {
  seen.internet = [await reaches(internet, 'allowed.test'), await reaches(internet, 'other.test')]
} finally {
  await internet.kill()
}

console.log(JSON.stringify(seen))

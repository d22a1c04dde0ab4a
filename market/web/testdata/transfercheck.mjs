// Unit tests of the page's upload rules (static/transfer.js), for
// transfer_test.go, with a fake tus-js-client, API, fetch and clock (no
// DOM, no network, no waiting):
//   node transfercheck.mjs TRANSFER_JS GROUP
// GROUP is retries, noRetry, halving, queueOrder or queueLimit. Prints
// "ok GROUP: N checks" and exits 0, or prints every broken rule on stderr
// and exits 1.
import assert from 'node:assert/strict'
import { pathToFileURL } from 'node:url'

const [script, group] = process.argv.slice(2)
if (!script || !group) {
  console.error('usage: node transfercheck.mjs TRANSFER_JS GROUP')
  process.exit(2)
}
const { Transfer, Queue, CHUNK_SIZE, MIN_CHUNK_SIZE, TICKET_RATE_RETRIES } = await import(pathToFileURL(script).href)
const MiB = 1024 * 1024

// FakeUpload stands for tus-js-client's Upload: it records its start and
// has a session address (url) once told to.
class FakeUpload {
  constructor (file, options) {
    this.file = file
    this.options = options
    this.url = null
  }

  findPreviousUploads () { return Promise.resolve([]) }
  start () { this.started = true }
  abort () { return Promise.resolve() }
}

// fakeEnv is a Transfer's env: answers from the API in order (then a
// ticket), fetches that hang until told, a clock that only records.
function fakeEnv (opts = {}) {
  const env = {
    tus: { Upload: FakeUpload, defaultOptions: { urlStorage: null } },
    asked: [],
    answers: opts.answers || [],
    api: async (path, body) => {
      env.asked.push(path)
      if (path === '/market/vm-images/ticket' && env.answers.length) return env.answers.shift()
      if (path === '/market/vm-images/ticket') {
        return { ok: true, status: 201, data: { upload_id: 'up-' + body.name, upload_url: 'http://127.0.0.1:8480/upload/' + body.name } }
      }
      return { ok: true, status: 200, data: {} }
    },
    fetched: [],
    fetch: (url) => {
      env.fetched.push(url)
      return new Promise(() => {})
    },
    slept: [],
    sleep: (ms) => {
      env.slept.push(ms)
      return Promise.resolve()
    },
    checkFile: async () => ({ ok: true, version: 3, virtualSize: 1 << 30 }),
    max: opts.max || 4,
    limits: () => ({ max_transfers: env.max, upload_max_bytes: 32 << 30, max_virtual_bytes: 512 << 30 }),
    images: () => [],
    refresh: () => Promise.resolve(),
    origin: 'http://127.0.0.1:8481'
  }
  env.queue = new Queue(() => env.max)
  return env
}

const file = (name) => ({ name, size: 10 * MiB, lastModified: 1 })

// uploading is a Transfer past its ticket, its Upload started, with a
// session address on the edge unless told otherwise.
async function uploading (env, name = 'disk.qcow2', session = true) {
  const t = new Recorded(file(name), false, env)
  env.queue.add(t)
  await t.check()
  await settle()
  assert.equal(t.state, 'uploading', `${name}: not uploading after its check`)
  if (session) t.upload.url = 'http://127.0.0.1:8480/upload/' + name
  return t
}

// failure is the error tus-js-client hands onShouldRetry: status 0 for a
// request that got no answer, else the edge's (or a proxy's) answer.
function failure (status, reason, method = 'PATCH') {
  return {
    originalRequest: { getMethod: () => method },
    originalResponse: status ? { getStatus: () => status, getBody: () => reason ? JSON.stringify({ error: 'x', reason }) : '<html>' } : null
  }
}

// settle lets every promise already on its way run.
async function settle () {
  for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve))
}

let checks = 0
const broken = []
function check (what, fn) {
  checks++
  return Promise.resolve().then(fn).catch((e) => broken.push(`${what}: ${e.message}`))
}

const groups = {
  // What the page tries again: a conflict or a locked session, a slow
  // request, an edge that is busy or restarting, a 5xx but a full disk,
  // a body cut short, no answer at all, a proxy's 413 (with smaller
  // parts), and a ticket refused for the rate (after the wait it asks for).
  async retries () {
    const cases = [[409, 'offsetMismatch'], [423, 'locked'], [408, 'requestTimeout'], [429, 'busy'],
      [500, 'internal'], [502, ''], [503, 'shuttingDown'], [504, ''], [400, 'incompleteBody']]
    for (const [status, reason] of cases) {
      await check(`${status} ${reason}`, async () => {
        const t = await uploading(fakeEnv())
        assert.equal(t.shouldRetry(failure(status, reason), 0, t.upload.options), true, 'not tried again')
        assert.equal(t.state, 'retrying')
      })
    }
    await check('no answer, with a session', async () => {
      const env = fakeEnv()
      const t = await uploading(env)
      assert.equal(t.shouldRetry(failure(0), 5, t.upload.options), true, 'not tried again')
      assert.deepEqual(env.fetched, [], 'probed the edge although it had answered before')
    })
    await check('no answer before a session: tried again while the probe runs', async () => {
      const env = fakeEnv()
      const t = await uploading(env, 'disk.qcow2', false)
      assert.equal(t.shouldRetry(failure(0, '', 'POST'), 0, t.upload.options), true, 'not tried again')
      assert.deepEqual(env.fetched, ['http://127.0.0.1:8480/'], 'the data plane was not probed once')
      t.reach = 'silent'
      assert.equal(t.shouldRetry(failure(0, '', 'POST'), 1, t.upload.options), true, 'a silent edge not tried a second time')
    })
    await check("a proxy's 413", async () => {
      const t = await uploading(fakeEnv())
      assert.equal(t.shouldRetry(failure(413, ''), 0, t.upload.options), true, 'not tried again with smaller parts')
    })
    await check('a ticket refused for the rate', async () => {
      const env = fakeEnv({ answers: [{ ok: false, status: 429, reason: 'rateLimited', retryAfter: 0 }, { ok: false, status: 429, reason: 'rateLimited', retryAfter: 90 }] })
      const t = await uploading(env)
      assert.deepEqual(env.asked, ['/market/vm-images/ticket', '/market/vm-images/ticket', '/market/vm-images/ticket'], 'asked for the ticket again')
      assert.deepEqual(env.slept, [2000, 30000], 'waited 2 s without Retry-After, at most 30 s')
      assert.equal(t.uploadId, 'up-disk', 'the third answer\'s ticket')
    })
    // Retry stays offered where trying again later may pass.
    for (const [status, reason] of [[507, 'noSpace'], [503, 'busy'], [500, ''], [423, 'locked'], [0, '']]) {
      await check(`Retry offered after ${status} ${reason}`, async () => {
        const t = await uploading(fakeEnv())
        t.error(failure(status, reason))
        assert.equal(t.state, 'refused')
        assert.equal(t.retryable, true, 'no Retry')
      })
    }
  },

  // What the page does not try again: a verdict on the image, a lost
  // session, a full disk, a refused rate, a body the edge itself finds too
  // large, an edge that answers without letting the page read it, one
  // that stays silent past its quick tries, a cancelled upload, and a
  // ticket refused for anything but the rate or past its tries.
  async noRetry () {
    const cases = [[400, 'badRequest'], [400, 'repeatedHeader'], [401, 'unauthorized'], [403, 'notSharing'], [404, 'sessionUnknown'],
      [410, ''], [412, 'tusVersion'], [413, 'tooLarge'], [415, 'badContentType'], [422, 'notQcow2'], [422, 'backingFile'],
      [429, 'rateLimited'], [460, ''], [507, 'noSpace']]
    for (const [status, reason] of cases) {
      await check(`${status} ${reason}`, async () => {
        const t = await uploading(fakeEnv())
        assert.equal(t.shouldRetry(failure(status, reason), 0, t.upload.options), false, 'tried again')
        assert.equal(t.upload.options.chunkSize, CHUNK_SIZE, 'parts changed')
      })
    }
    await check('cancelled', async () => {
      const t = await uploading(fakeEnv())
      await t.cancel()
      assert.equal(t.shouldRetry(failure(503, 'busy'), 0, t.upload.options), false, 'tried again')
      assert.equal(t.shouldRetry(failure(0), 0, t.upload.options), false, 'tried again')
    })
    await check('blocked by the edge\'s CORS before a session', async () => {
      const t = await uploading(fakeEnv(), 'disk.qcow2', false)
      t.reach = 'answers'
      assert.equal(t.shouldRetry(failure(0, '', 'POST'), 0, t.upload.options), false, 'tried again')
    })
    await check('silent before a session, after two tries', async () => {
      const t = await uploading(fakeEnv(), 'disk.qcow2', false)
      t.reach = 'silent'
      assert.equal(t.shouldRetry(failure(0, '', 'POST'), 2, t.upload.options), false, 'tried for minutes')
    })
    await check('a ticket refused for the quota', async () => {
      const env = fakeEnv({ answers: [{ ok: false, status: 403, reason: 'imageQuota', error: 'x' }] })
      const t = new Recorded(file('disk.qcow2'), false, env)
      env.queue.add(t)
      await t.check()
      await settle()
      assert.equal(t.state, 'refused')
      assert.deepEqual(env.asked.filter((p) => p === '/market/vm-images/ticket').length, 1, 'asked again')
      assert.deepEqual(env.slept, [])
    })
    await check('a ticket refused for the rate, past its tries', async () => {
      const limited = { ok: false, status: 429, reason: 'rateLimited', retryAfter: 1 }
      const env = fakeEnv({ answers: Array(TICKET_RATE_RETRIES + 2).fill(limited) })
      const t = new Recorded(file('disk.qcow2'), false, env)
      env.queue.add(t)
      await t.check()
      await settle()
      assert.equal(t.state, 'refused')
      assert.equal(env.asked.filter((p) => p === '/market/vm-images/ticket').length, TICKET_RATE_RETRIES + 1, 'asks')
      assert.equal(env.slept.length, TICKET_RATE_RETRIES, 'waits')
    })
    // A verdict on the image or a lost session ends it: no Retry.
    for (const [status, reason] of [[422, 'notQcow2'], [404, 'sessionUnknown'], [413, 'tooLarge'], [400, 'badRequest']]) {
      await check(`no Retry after ${status} ${reason}`, async () => {
        const t = await uploading(fakeEnv())
        t.error(failure(status, reason))
        assert.equal(t.state, 'refused')
        assert.equal(t.retryable, false, 'Retry offered')
      })
    }
  },

  // A proxy's 413 halves the parts, 8 → 4 → 2 → 1 MiB, and never below
  // 1 MiB: there the upload stops, saying the proxy's limit. Two lost
  // PATCHes while HEAD answers at the same offset halve them too.
  async halving () {
    await check("a proxy's 413s", async () => {
      const t = await uploading(fakeEnv())
      const sizes = []
      for (let i = 0; i < 3; i++) {
        assert.equal(t.shouldRetry(failure(413, ''), 0, t.upload.options), true, `413 number ${i + 1} not tried again`)
        sizes.push(t.upload.options.chunkSize / MiB)
      }
      assert.deepEqual(sizes, [4, 2, 1], 'parts after each 413, in MiB')
      assert.equal(t.shouldRetry(failure(413, ''), 0, t.upload.options), false, 'tried again at the smallest parts')
      assert.equal(t.upload.options.chunkSize, MIN_CHUNK_SIZE, 'parts below the floor')
      assert.equal(t.halve(), false, 'halved at the floor')
      assert.equal(t.upload.options.chunkSize, MIN_CHUNK_SIZE, 'parts below the floor')
      t.error(failure(413, ''))
      assert.equal(t.state, 'refused')
      assert.equal(t.shown.reason, 'proxyTooLarge', 'the refusal\'s reason')
    })
    await check('lost PATCHes while HEAD answers', async () => {
      const t = await uploading(fakeEnv())
      const head = { getMethod: () => 'HEAD' }
      const at = (off) => ({ getStatus: () => 200, getHeader: (h) => h === 'Upload-Offset' ? String(off) : undefined })
      t.afterResponse(head, at(4 * MiB))
      t.shouldRetry(failure(0), 0, t.upload.options)
      t.afterResponse(head, at(4 * MiB))
      assert.equal(t.upload.options.chunkSize, CHUNK_SIZE, 'halved after one lost PATCH')
      t.shouldRetry(failure(0), 1, t.upload.options)
      t.afterResponse(head, at(4 * MiB))
      assert.equal(t.upload.options.chunkSize, CHUNK_SIZE / 2, 'not halved after two lost PATCHes')
      for (let i = 0; i < 8; i++) {
        t.shouldRetry(failure(0), 1, t.upload.options)
        t.afterResponse(head, at(4 * MiB))
      }
      assert.equal(t.upload.options.chunkSize, MIN_CHUNK_SIZE, 'parts below the floor, or not down to it')
    })
  },

  // Files start in the order they were chosen: the first waiting one
  // whenever a transfer ends, cancelled ones skipped.
  async queueOrder () {
    await check('order', async () => {
      const env = fakeEnv({ max: 1 })
      const ts = await chosen(env, 4)
      assert.deepEqual(begun, ['f0'], 'began')
      ts[0].success()
      await settle()
      assert.deepEqual(begun, ['f0', 'f1'], 'began after the first ended')
      await ts[2].cancel()
      ts[1].fail('network', 'x')
      await settle()
      assert.deepEqual(begun, ['f0', 'f1', 'f3'], 'began after the second ended, the third cancelled')
      ts[1].retry()
      await settle()
      assert.deepEqual(begun, ['f0', 'f1', 'f3'], 'a retried file jumped the queue')
      ts[3].success()
      await settle()
      assert.deepEqual(begun, ['f0', 'f1', 'f3', 'f1'], 'a retried file did not run once there was room')
    })
  },

  // At most max_transfers (at least one) run at once, and a free slot is
  // taken at once.
  async queueLimit () {
    await check('limit', async () => {
      const env = fakeEnv({ max: 2 })
      const ts = await chosen(env, 5)
      assert.equal(env.queue.running(), 2, 'running with max_transfers 2')
      assert.deepEqual(begun, ['f0', 'f1'])
      ts[1].success()
      await settle()
      assert.equal(env.queue.running(), 2, 'running after one of two ended')
      env.max = 3
      env.queue.pump()
      await settle()
      assert.equal(env.queue.running(), 3, 'running with max_transfers 3')
      env.max = 0
      for (const t of ts.filter((t) => t.active)) t.success()
      await settle()
      assert.equal(env.queue.running(), 1, 'running with max_transfers 0 (an edge that says none)')
      assert.equal(begun.length, 5, 'every file began')
    })
  }
}

// begun are the files whose transfer began, in order; a Recorded
// transfer keeps what it last showed.
const begun = []
class Recorded extends Transfer {
  show (st, text, reason) {
    this.shown = { st, text, reason }
  }

  begin () {
    begun.push(this.file.name)
    return super.begin()
  }
}

// chosen checks n files, f0 to f(n-1), as the page does when they are
// chosen together, and lets the queue start what it may.
async function chosen (env, n) {
  const ts = []
  for (let i = 0; i < n; i++) {
    const t = new Recorded(file('f' + i), false, env)
    env.queue.add(t)
    ts.push(t)
  }
  for (const t of ts) await t.check()
  await settle()
  for (const t of ts) assert.ok(t.active || t.state === 'waiting', `${t.file.name} is ${t.state}`)
  return ts
}

if (!groups[group]) {
  console.error(`no group ${group}: ${Object.keys(groups).join(', ')}`)
  process.exit(2)
}
await groups[group]()
if (broken.length) {
  console.error(broken.join('\n'))
  process.exit(1)
}
console.log(`ok ${group}: ${checks} checks`)

// transfer.js: the rules of the page's uploads, without the page: when a
// failed request is tried again, how a part shrinks when a proxy refuses
// it, and the queue that keeps at most the edge's max_transfers uploads
// running. Nothing here touches the DOM or a global: what it needs from
// the browser (tus-js-client, fetch, the clock, the API) comes in env, so
// that node runs it in market/web's TestTransfer* tests with fakes.
// uploads.js draws each Transfer as a row of the page.

import { refusal, words } from './reasons.js'
import { bytes, MiB } from './format.js'

// 8 MiB passes a proxy with a 16 MiB body limit with room; a proxy's 413
// halves it, down to 1 MiB.
export const CHUNK_SIZE = 8 * MiB
export const MIN_CHUNK_SIZE = 1 * MiB
// Bounded: about three minutes of trying, then the row says why and
// offers Retry. The attempt count starts again whenever bytes get through.
export const RETRY_DELAYS = [0, 1000, 3000, 5000, 10000, 20000, 30000, 30000, 30000, 30000]
export const TICKET_RATE_RETRIES = 3

// fingerprint keys a file's session address in tus-js-client's URL
// storage: the same file chosen again on this page's origin finds it.
export function fingerprint (file, origin) {
  return `vmshelf:${origin}/${file.name}/${file.size}/${file.lastModified}`
}

// imageName is the image a file becomes: its name without .qcow2.
export function imageName (file) {
  const n = file.name.replace(/\.qcow2$/i, '').trim()
  return n || file.name
}

// parseBody is the edge's JSON answer of a tus-js-client response, {} when
// there is none.
function parseBody (res) {
  if (!res) return {}
  try {
    const b = JSON.parse(res.getBody() || '')
    return b && typeof b === 'object' ? b : {}
  } catch (e) {
    return {}
  }
}

// Queue holds the page's transfers in the order they were chosen and
// starts those waiting, in that order, while fewer than limit() run.
export class Queue {
  constructor (limit) {
    this.limit = limit
    this.transfers = new Set()
  }

  add (t) { this.transfers.add(t) }
  delete (t) { this.transfers.delete(t) }
  [Symbol.iterator] () { return this.transfers.values() }

  running () {
    let n = 0
    for (const t of this.transfers) if (t.active) n++
    return n
  }

  pump () {
    for (const t of this.transfers) {
      if (this.running() >= Math.max(1, this.limit())) return
      if (t.state === 'waiting' && t.queued) t.begin()
    }
  }
}

// Transfer is one file's upload: its check, its ticket, its tus-js-client
// upload and what happens when a request fails. What it shows goes through
// show, announce, showUploadId, showResumed and showProgress, which do
// nothing here and draw the row in uploads.js.
//
// env: tus (tus-js-client: Upload, defaultOptions.urlStorage), api
// (api.js's), fetch, sleep(ms), checkFile (qcow2.js's), limits() (the
// edge's), images() (the box's, after a refresh), refresh(), origin (the
// page's), queue (a Queue).
export class Transfer {
  constructor (file, efi, env) {
    this.file = file
    this.efi = efi
    this.env = env
    this.queue = env.queue
    this.state = ''
    this.active = false // counts against max_transfers
    this.queued = false
    this.upload = null
    this.resumed = false
    this.renewed = false // a fresh ticket after a lost session, once
    this.proxyHeadOK = 0
  }

  show (st, text, reason, changed) {}
  announce (text) {}
  showUploadId () {}
  showResumed () {}
  showProgress (sent, total) {}

  set (st, text, reason) {
    const changed = st !== this.state
    this.state = st
    this.show(st, text, reason, changed)
  }

  setUploadId (id) {
    if (id) {
      this.uploadId = id
      this.showUploadId()
    }
  }

  async check () {
    this.set('checking', 'reading the header')
    const v = await this.env.checkFile(this.file, {
      maxVirtualBytes: this.env.limits().max_virtual_bytes, uploadMaxBytes: this.env.limits().upload_max_bytes
    })
    if (this.state === 'cancelled') return
    if (!v.ok) {
      const limits = this.env.limits()
      this.retryable = false
      let text = words(v.reason, v.message)
      if (v.reason === 'tooLarge') text = `This file (${bytes(this.file.size)}) is larger than the ${bytes(limits.upload_max_bytes)} this edge accepts.`
      if (v.reason === 'virtualSizeTooLarge') text = `The disk inside this image (${bytes(v.virtualSize)}) is larger than the ${bytes(limits.max_virtual_bytes)} this edge accepts.`
      this.set('refused', text, v.reason)
      return
    }
    this.info = v
    this.queued = true
    this.set('waiting', `QCOW2 v${v.version}, disk ${bytes(v.virtualSize)}; waiting for a free transfer slot`)
    this.queue.pump()
  }

  // begin runs the upload: resume this file's previous session if
  // this browser has one, else take a ticket and create one.
  async begin () {
    this.queued = false
    this.active = true
    this.retryable = true
    this.set('uploading', 'looking for an earlier upload of this file')
    try {
      await this.start()
    } catch (e) {
      this.fail('network', 'The upload could not start: ' + (e && e.message ? e.message : e))
    }
  }

  options () {
    const t = this
    return {
      chunkSize: CHUNK_SIZE,
      retryDelays: RETRY_DELAYS.slice(),
      removeFingerprintOnSuccess: true,
      storeFingerprintForResuming: true,
      metadata: { filename: this.file.name },
      // Not the endpoint: it changes with every ticket, and the
      // same file must find its session again.
      fingerprint: (file) => Promise.resolve(fingerprint(file, t.env.origin)),
      onProgress: (sent, total) => t.progress(sent, total),
      onAfterResponse: (req, res) => t.afterResponse(req, res),
      onShouldRetry: (err, attempt, opts) => t.shouldRetry(err, attempt, opts),
      onError: (err) => t.error(err),
      onSuccess: () => t.success()
    }
  }

  async start () {
    const opts = this.options()
    const up = new this.env.tus.Upload(this.file, opts)
    this.upload = up
    this.chunk = CHUNK_SIZE
    let prev = []
    try { prev = await up.findPreviousUploads() } catch (e) {}
    if (this.state === 'cancelled') return
    prev.sort((a, b) => String(b.creationTime).localeCompare(String(a.creationTime)))
    if (prev.length && !this.fresh) {
      const p = prev[0]
      this.setUploadId(p.metadata && p.metadata.upload_id)
      this.resumedFrom = p
      up.resumeFromPreviousUpload(p)
      this.set('uploading', 'resuming the earlier upload of this file')
      up.start()
      return
    }
    const tk = await this.ticket()
    if (!tk || this.state === 'cancelled') return
    this.setUploadId(tk.upload_id)
    up.options.endpoint = tk.upload_url
    up.options.metadata = { filename: this.file.name, upload_id: tk.upload_id }
    this.set('uploading', 'starting')
    up.start()
  }

  async ticket () {
    const name = imageName(this.file)
    for (let i = 0; ; i++) {
      const ans = await this.env.api('/market/vm-images/ticket', { name, efi: this.efi })
      if (this.state === 'cancelled') return null
      if (ans.ok) return ans.data
      if (ans.reason === 'rateLimited' && i < TICKET_RATE_RETRIES) {
        const wait = Math.min(30, Math.max(1, ans.retryAfter || 2))
        this.set('retrying', `too many tickets at once; asking again in ${wait} s`, 'rateLimited')
        await this.env.sleep(wait * 1000)
        continue
      }
      this.upload = null
      this.retryable = ans.reason === 'network' || ans.reason === 'noSpace' || ans.reason === 'imageQuota' || ans.status >= 500
      this.fail(ans.reason, refusal(ans))
      return null
    }
  }

  progress (sent, total) {
    this.showProgress(sent, total)
  }

  afterResponse (req, res) {
    const method = req.getMethod()
    const status = res.getStatus()
    const offHeader = res.getHeader('Upload-Offset')
    if (offHeader !== undefined && offHeader !== null && offHeader !== '') this.offset = Number(offHeader)
    if (method === 'HEAD' && status === 200) {
      const off = Number(offHeader)
      if (off > 0 && !this.resumed && this.resumedFrom) {
        this.resumed = true
        this.showResumed()
        this.set('uploading', `resumed at ${bytes(off)}`)
      }
      // A PATCH that died without an answer while the edge answers
      // HEAD at the same offset, twice: the mark of a proxy that
      // drops big bodies without a readable 413 (no CORS headers on
      // its error page). Smaller chunks it is.
      if (this.lastPatchLost && off === this.lastPatchOffset) this.proxyHeadOK++
      else this.proxyHeadOK = 0
      this.lastPatchLost = false
      if (this.proxyHeadOK >= 2) {
        this.proxyHeadOK = 0
        const before = this.upload ? this.upload.options.chunkSize : 0
        if (this.halve()) {
          this.set('retrying', `parts of ${bytes(before)} get no answer while the edge answers otherwise, the mark of a proxy's body limit; going on with ${bytes(this.chunk)} parts`)
        }
      }
    }
  }

  // halve makes the chunks smaller after a proxy refused a body;
  // false when they are as small as they go.
  halve () {
    const up = this.upload
    if (!up || up.options.chunkSize <= MIN_CHUNK_SIZE) return false
    up.options.chunkSize = Math.max(MIN_CHUNK_SIZE, Math.floor(up.options.chunkSize / 2))
    this.chunk = up.options.chunkSize
    return true
  }

  shouldRetry (err, attempt, opts) {
    if (this.state === 'cancelled') return false
    const res = err.originalResponse
    const req = err.originalRequest
    const status = res ? res.getStatus() : 0
    const body = parseBody(res)
    const reason = body.reason || ''
    const left = RETRY_DELAYS.length - attempt - 1
    const next = RETRY_DELAYS[attempt] || 0
    const wait = next ? ` in ${Math.round(next / 1000)} s` : ''
    if (status === 413 && reason !== 'tooLarge') {
      // Not the edge's JSON: a proxy's body limit.
      const before = opts.chunkSize
      this.proxyLimit = before
      if (!this.halve()) return false
      this.set('retrying', `a proxy in front of the edge refuses requests over ${bytes(before)}; going on with ${bytes(opts.chunkSize)} parts`)
      return true
    }
    if (status === 0) {
      // No answer before the upload has a session: the edge may be
      // down, or answer without letting this page read it (its CORS).
      // A probe that cannot be blocked tells the two apart, and a
      // blocked request is not tried again: it would be blocked again.
      if (!this.upload || !this.upload.url) {
        if (this.reach === 'answers') return false
        // Nothing answers at all before a byte was sent: a few quick
        // tries, then say so, rather than minutes of retries.
        if (this.reach === 'silent' && attempt >= 2) return false
        if (!this.reach) this.probeReach()
      }
      if (req && req.getMethod() === 'PATCH') {
        this.lastPatchLost = true
        this.lastPatchOffset = this.offset
      }
      this.set('retrying', `no answer from the edge; trying again${wait} (${left} tries left)`, 'network')
      return true
    }
    const retry = status === 409 || status === 423 || status === 408 || status === 429 && reason !== 'rateLimited' ||
      status >= 500 && status !== 507 || status === 400 && reason === 'incompleteBody'
    if (retry) {
      this.set('retrying', `${words(reason, `HTTP ${status}`)} Trying again${wait} (${left} tries left).`, reason || ('http' + status))
    }
    return retry
  }

  error (err) {
    if (this.state === 'cancelled') return
    const res = err.originalResponse
    const status = res ? res.getStatus() : 0
    const body = parseBody(res)
    let reason = body.reason || ''
    // The session this browser remembered is gone (expired, ended):
    // start over with a ticket, once.
    if (this.resumedFrom && !this.renewed && (status === 404 || reason === 'sessionUnknown' ||
        /cannot be created without an endpoint/.test(String(err && err.message)))) {
      this.renewed = true
      this.fresh = true
      this.resumedFrom = null
      this.resumed = false
      this.showResumed()
      this.set('uploading', 'the earlier upload is gone on the edge; starting over')
      this.start().catch((e) => this.fail('network', String(e)))
      return
    }
    if (status === 413 && reason !== 'tooLarge' && this.proxyLimit) {
      this.retryable = true
      this.fail('proxyTooLarge', `A proxy in front of the edge refuses requests over ${bytes(this.proxyLimit)}, and this page sends no smaller parts. Its operator must raise the limit (nginx: client_max_body_size).`)
      return
    }
    if (!status) {
      this.retryable = true
      if (!this.upload || !this.upload.url) {
        // Not a byte was sent: the ticket goes back to the quota,
        // and Retry asks for a new one.
        this.releaseTicket()
        if (this.reach === 'answers') {
          const origin = this.env.origin
          this.fail('corsBlocked', `${words('corsBlocked')} Open this page at the address its operator gave you, or ask them to allow ${origin} (serve's --cors-origin ${origin}). Nothing was sent; Retry tries again.`)
          return
        }
        if (this.reach === 'silent') {
          // The connection itself fails: the edge's upload address is
          // down or out of this browser's reach (the page came from
          // the control plane, which did answer).
          this.fail('network', `Nothing answers at the edge's upload address ${this.dataOrigin()}, even after several tries: it is down, or not reachable from this browser. Nothing was sent; check the address with the edge's operator and press Retry.`)
          return
        }
      }
      this.fail('network', words('network'))
      return
    }
    if (!reason) reason = status === 413 ? 'proxyTooLarge' : 'http' + status
    // A verdict on the image or a lost session ends it; a full disk
    // or an overloaded edge may pass.
    this.retryable = ['noSpace', 'busy', 'shuttingDown', 'locked', 'internal', 'idle', 'rateLimited'].includes(reason) || status >= 500
    if (!this.retryable) this.forget()
    this.fail(reason, words(reason, body.error || `HTTP ${status}`))
  }

  // probeReach asks the data plane for anything with a request no
  // CORS rule can block (mode no-cors: the answer stays opaque): it
  // resolves when the edge answers at all, and fails when nothing
  // does. this.reach becomes 'answers' or 'silent'.
  probeReach () {
    this.reach = 'probing'
    const origin = this.dataOrigin()
    if (!origin) { this.reach = ''; return }
    this.env.fetch(origin + '/', { mode: 'no-cors', cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' })
      .then(() => { this.reach = 'answers' }, () => { this.reach = 'silent' })
  }

  // dataOrigin is the origin of the data plane this upload goes to.
  dataOrigin () {
    try { return new URL(this.upload.options.endpoint).origin } catch (e) { return '' }
  }

  // releaseTicket cancels the ticket of an upload that never reached
  // the edge, so that a failed try does not hold a place of the
  // quota for the ticket's hour.
  releaseTicket () {
    const id = this.uploadId
    if (!id || this.resumedFrom) return
    this.uploadId = ''
    this.showUploadId()
    this.env.api('/market/vm-images/ticket/cancel', { upload_id: id }).then(() => this.env.refresh(), () => {})
  }

  // forget drops this file's session address from the URL storage
  // once the edge gave its verdict: it can never be resumed.
  forget () {
    const up = this.upload
    const s = this.env.tus.defaultOptions.urlStorage
    if (!up || !up.url || !s) return
    up.findPreviousUploads().then((prev) => Promise.all(prev.filter((p) => p.uploadUrl === up.url)
      .map((p) => s.removeUpload(p.urlStorageKey)))).catch(() => {})
  }

  fail (reason, text) {
    this.active = false
    this.set('refused', text, reason)
    this.queue.pump()
    this.env.refresh()
  }

  success () {
    this.active = false
    this.set('done', 'checked and stored')
    this.announce(`${this.file.name}: 100 %, stored`)
    this.queue.pump()
    this.env.refresh().then(() => this.showStored())
  }

  showStored () {
    const img = this.env.images().find((i) => i.upload_id === this.uploadId)
    if (img) this.set('done', `stored as “${img.name}”, SHA-256 ${img.sha256}`)
  }

  async cancel () {
    const was = this.state
    this.queued = false
    this.active = false
    this.set('cancelled', 'cancelling')
    const up = this.upload
    if (up && (was === 'uploading' || was === 'retrying' || was === 'refused')) {
      try {
        // abort(true) ends the session on the edge (tus DELETE) and
        // forgets it here.
        await up.abort(true)
        this.set('cancelled', 'the upload was ended on the edge')
      } catch (e) {
        this.set('cancelled', 'stopped here; the edge drops the unfinished upload within 24 hours')
      }
    } else {
      this.set('cancelled', '')
    }
    this.queue.pump()
    this.env.refresh()
  }

  retry () {
    this.proxyLimit = 0
    this.reach = ''
    this.queued = true
    this.set('waiting', 'waiting for a free transfer slot')
    this.queue.pump()
  }
}

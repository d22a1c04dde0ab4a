// uploads.js: the upload rows of the page. Each file chosen becomes a
// Row, a Transfer (transfer.js, the upload's rules) drawn in #upload-list;
// the edge's unfinished uploads that no row works on are listed too, so
// that a reload shows them and says how to go on.
//
// Upload session URLs (capabilities for one upload, 24 h) live in
// localStorage through tus-js-client's URL storage, keyed by a fingerprint
// of the file, so that a reload or a new browser session resumes instead
// of starting over. tus-js-client is window.tus, the vendored classic
// script index.html loads before the page's modules.

import { api } from './api.js'
import { $, el } from './dom.js'
import { bytes, when, duration } from './format.js'
import { checkFile } from './qcow2.js'
import { state, refresh } from './status.js'
import { Queue, Transfer } from './transfer.js'

const SPEED_WINDOW_MS = 5000

// data-state → the row's first word. "waiting" is a file queued for a
// free transfer slot (the page goes on by itself); an unfinished upload
// the edge holds for a file this page does not have says what the user
// must do (SESSION_WORDS: this browser can resume it, or only the one
// that started it can, since only that one has its session address).
const UPLOAD_STATES = {
  checking: 'Checking the file',
  waiting: 'Queued',
  uploading: 'Uploading',
  retrying: 'Retrying',
  done: 'Stored',
  refused: 'Refused',
  cancelled: 'Cancelled'
}
const SESSION_WORDS = { mine: 'Choose the file again', elsewhere: 'Resume it where it started' }

// The page's transfers, at most the edge's max_transfers running.
const queue = new Queue(() => state.limits.max_transfers)

// env is what a Transfer takes from the page and the browser.
const env = {
  get tus () { return window.tus },
  api,
  fetch: (url, init) => fetch(url, init),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
  checkFile,
  limits: () => state.limits,
  images: () => (state.status && state.status.images) || [],
  refresh,
  origin: location.origin,
  queue
}

function live (text) {
  $('#upload-live').textContent = text
}
function storedUploads () {
  const s = window.tus && window.tus.defaultOptions && window.tus.defaultOptions.urlStorage
  if (!s || !s.findAllUploads) return Promise.resolve([])
  return s.findAllUploads().catch(() => [])
}

// Row is a Transfer with its row in #upload-list: its bar, numbers, state
// in words and buttons.
class Row extends Transfer {
  constructor (file, efi) {
    super(file, efi, env)
    this.samples = []
    this.lastAnnounced = -1
    this.build()
  }

  build () {
    const f = this.file
    this.bar = el('progress', { class: 'upload-bar', max: 100, value: 0, 'aria-label': `Upload of ${f.name}` })
    this.percent = el('span', { class: 'upload-percent', text: '0 %' })
    this.speed = el('span', { class: 'upload-speed' })
    this.eta = el('span', { class: 'upload-eta' })
    this.stateWord = el('span', { class: 'upload-state' })
    this.statusText = el('span', { class: 'upload-text' })
    this.status = el('p', { class: 'upload-status' }, this.stateWord, ' ', this.statusText)
    this.cancelBtn = el('button', { type: 'button', class: 'upload-cancel', 'aria-label': `Cancel the upload of ${f.name}`, text: 'Cancel' })
    this.retryBtn = el('button', { type: 'button', class: 'upload-retry', 'aria-label': `Retry the upload of ${f.name}`, text: 'Retry', hidden: true })
    this.dismissBtn = el('button', { type: 'button', class: 'upload-dismiss', 'aria-label': `Dismiss the row of ${f.name}`, text: 'Dismiss', hidden: true })
    this.cancelBtn.addEventListener('click', () => this.cancel())
    this.retryBtn.addEventListener('click', () => this.retry())
    this.dismissBtn.addEventListener('click', () => this.dismiss())
    this.numbers = el('div', { class: 'upload-numbers' }, this.percent, this.speed, this.eta)
    this.li = el('li', { class: 'upload', 'data-file': f.name },
      el('div', { class: 'card-head' }, el('span', { class: 'upload-name', text: f.name }),
        el('span', { class: 'meta', text: bytes(f.size) })),
      this.bar,
      this.numbers,
      this.status,
      el('div', { class: 'actions' }, this.retryBtn, this.cancelBtn, this.dismissBtn))
  }

  show (st, text, reason, changed) {
    if (st === 'done') {
      this.bar.value = 100
      this.percent.textContent = '100 %'
    }
    this.li.dataset.state = st
    if (reason) this.li.dataset.reason = reason
    else delete this.li.dataset.reason
    // A network that stayed down is no refusal by the edge.
    this.stateWord.textContent = (st === 'refused' && (reason === 'network' || this.retryable) ? 'Stopped, press Retry' : UPLOAD_STATES[st]) + ':'
    this.statusText.textContent = text || ''
    const ended = st === 'done' || st === 'refused' || st === 'cancelled'
    // Running: Cancel. Ended: Dismiss (and Retry where trying again
    // may pass).
    this.cancelBtn.hidden = ended
    this.dismissBtn.hidden = !ended
    this.retryBtn.hidden = !(st === 'refused' && this.retryable)
    // A refused row shows no bar: the refusal is its news. A bar
    // stays only where Retry goes on from bytes already sent.
    const bar = !(st === 'refused' && !(this.retryable && this.bar.value > 0))
    this.bar.hidden = !bar
    this.numbers.hidden = !bar
    if (ended) {
      this.speed.textContent = ''
      this.eta.textContent = ''
    }
    if (changed) live(`${this.file.name}: ${UPLOAD_STATES[st].toLowerCase()}${text ? ', ' + text : ''}`)
  }

  announce (text) { live(text) }

  showUploadId () {
    if (this.uploadId) this.li.dataset.uploadId = this.uploadId
    else delete this.li.dataset.uploadId
  }

  showResumed () {
    if (this.resumed) this.li.dataset.resumed = 'true'
    else delete this.li.dataset.resumed
  }

  showProgress (sent, total) {
    const now = performance.now()
    this.samples.push([now, sent])
    while (this.samples.length > 2 && now - this.samples[0][0] > SPEED_WINDOW_MS) this.samples.shift()
    const pct = total > 0 ? Math.floor((sent / total) * 100) : 0
    this.bar.value = pct
    this.percent.textContent = `${pct} %`
    const [t0, b0] = this.samples[0]
    const dt = (now - t0) / 1000
    if (dt >= 0.5 && sent >= b0) {
      const rate = (sent - b0) / dt
      this.speed.textContent = `${bytes(rate)}/s`
      this.eta.textContent = rate > 0 ? `about ${duration((total - sent) / rate)} left` : ''
    }
    if (this.state !== 'uploading') this.set('uploading', '')
    this.statusText.textContent = `${bytes(sent)} of ${bytes(total)} sent` + (this.resumed ? ' (resumed)' : '')
    const step = Math.floor(pct / 10)
    if (step > this.lastAnnounced) {
      this.lastAnnounced = step
      live(`${this.file.name}: ${pct} %`)
    }
  }

  // dismiss drops an ended row: the row, and this browser's record of
  // its upload session (localStorage), so that nothing of it comes
  // back after a reload. A session the edge may still hold (a
  // refusal Retry could go on from) is ended there first.
  async dismiss () {
    this.dismissBtn.disabled = true
    const up = this.upload
    const url = up && up.url
    if (url && this.state === 'refused' && this.retryable) {
      try { await window.tus.Upload.terminate(url, { retryDelays: [0, 1000] }) } catch (e) {}
    }
    const s = window.tus && window.tus.defaultOptions.urlStorage
    if (s) {
      const stored = await storedUploads()
      await Promise.all(stored.filter((p) => (url && p.uploadUrl === url) ||
        (this.uploadId && p.metadata && p.metadata.upload_id === this.uploadId))
        .map((p) => s.removeUpload(p.urlStorageKey).catch(() => {})))
    }
    const next = this.li.nextElementSibling || this.li.previousElementSibling
    queue.delete(this)
    this.li.remove()
    live(`${this.file.name}: dismissed`)
    const focus = next && next.querySelector('button:not([hidden])')
    if (focus) focus.focus()
    else if (!$('#upload-file').disabled) $('#upload-file').focus()
    else $('#main').focus()
    refresh()
  }
}

export function add (files, efi) {
  const list = $('#upload-list')
  for (const f of files) {
    const dup = [...queue].find((t) => t.file.name === f.name && t.file.size === f.size &&
      t.file.lastModified === f.lastModified && !['done', 'refused', 'cancelled'].includes(t.state))
    if (dup) {
      live(`${f.name} is already in the list`)
      continue
    }
    // A row from an earlier session for the same file gives way.
    for (const li of list.querySelectorAll('li.upload[data-session=true]')) {
      if (li.dataset.file === f.name) li.remove()
    }
    const t = new Row(f, efi)
    queue.add(t)
    list.prepend(t.li)
    t.check()
  }
}

// renderSessions lists the edge's unfinished uploads that no row of
// this page is working on, so a user sees them after a reload and
// knows how to go on.
export async function renderSessions (sessions) {
  const list = $('#upload-list')
  const mine = [...queue].filter((t) => t.state !== 'cancelled')
  const busyIds = new Set(mine.filter((t) => t.uploadId).map((t) => t.uploadId))
  // A file being checked or waiting has no upload id yet; its name
  // keeps its old session's row from coming back next to it.
  const busyFiles = new Set(mine.filter((t) => !t.uploadId && t.state !== 'refused').map((t) => t.file.name))
  const stored = await storedUploads()
  const fileOf = new Map()
  for (const s of stored) {
    if (s.metadata && s.metadata.upload_id) fileOf.set(s.metadata.upload_id, s)
  }
  const want = sessions.filter((s) => {
    const known = fileOf.get(s.upload_id)
    return !busyIds.has(s.upload_id) && !(known && busyFiles.has(known.metadata.filename))
  })
  const keep = new Set(want.map((s) => s.upload_id))
  for (const li of list.querySelectorAll('li.upload[data-session=true]')) {
    if (!keep.has(li.dataset.uploadId)) li.remove()
  }
  for (const s of want) {
    const known = fileOf.get(s.upload_id)
    const file = known && known.metadata.filename ? known.metadata.filename : ''
    const pct = s.length > 0 ? Math.floor((s.offset / s.length) * 100) : 0
    let li = list.querySelector(`li.upload[data-session=true][data-upload-id="${CSS.escape(s.upload_id)}"]`)
    const kept = `${bytes(s.offset)} of ${bytes(s.length)} are on the edge, which keeps them until ${when(s.expires_at)}`
    const text = known
      ? `${file ? `“${file}”` : 'the same file'} in the upload form above to resume: ${kept}.`
      : `another browser or program started this upload, and only it can resume or cancel it; ${kept}, holding a place of the quota until then.`
    const children = [
      el('div', { class: 'card-head' }, el('span', { class: 'upload-name', text: file || s.name }),
        el('span', { class: 'meta', text: `image “${s.name}”` })),
      el('progress', { class: 'upload-bar', max: 100, value: pct, 'aria-label': `Unfinished upload of ${s.name}` }),
      el('div', { class: 'upload-numbers' }, el('span', { class: 'upload-percent', text: `${pct} %` }),
        el('span', { class: 'upload-speed' }), el('span', { class: 'upload-eta' })),
      el('p', { class: 'upload-status' }, el('span', { class: 'upload-state', text: (known ? SESSION_WORDS.mine : SESSION_WORDS.elsewhere) + ':' }), ' ', text)
    ]
    if (known) {
      const btn = el('button', { type: 'button', class: 'upload-cancel', text: 'Cancel', 'aria-label': `Cancel the unfinished upload of ${s.name}` })
      btn.addEventListener('click', async () => {
        btn.disabled = true
        try {
          await window.tus.Upload.terminate(known.uploadUrl, { retryDelays: [0, 1000, 3000] })
        } catch (e) {}
        try { await window.tus.defaultOptions.urlStorage.removeUpload(known.urlStorageKey) } catch (e) {}
        refresh()
      })
      children.push(el('div', { class: 'actions' }, btn))
    }
    if (!li) {
      li = el('li', { class: 'upload', 'data-session': 'true', 'data-state': 'waiting', 'data-upload-id': s.upload_id })
      list.append(li)
    }
    li.dataset.file = file
    li.replaceChildren(...children)
  }
}

// busyIds are the upload ids this page's rows work on: their tickets
// and sessions are no one else's to list.
export function busyIds () {
  return new Set([...queue].filter((t) => t.uploadId && t.state !== 'cancelled').map((t) => t.uploadId))
}

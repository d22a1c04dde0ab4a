// app.js: the Machines page. Plain script, no build step: it needs
// window.tus (third_party/tus-js-client/tus.min.js, tus-js-client 4.3.1), window.vmshelfQcow2
// (qcow2.js) and window.vmshelfFormat (format.js), loaded before it with
// defer.
//
// The tenant token lives in sessionStorage["vmshelf.token"] only: it is
// sent to this origin's API in an Authorization header and never put in a
// URL. Upload session URLs (capabilities for one upload, 24 h) live in
// localStorage through tus-js-client's URL storage, keyed by a fingerprint
// of the file, so that a reload or a new browser session resumes instead
// of starting over.
//
// Every state the tests look at is a data-* attribute (see the DOM
// contract in the package's README); every refusal is shown in words.
(function () {
  'use strict'

  const TOKEN_KEY = 'vmshelf.token'
  const MiB = 1024 * 1024
  const GiB = 1024 * MiB
  // Used when status has no limits (an older edge): serve's own defaults.
  const DEFAULT_LIMITS = { images_per_tenant: 3, upload_max_bytes: 32 * GiB, max_virtual_bytes: 512 * GiB, max_transfers: 4 }
  // 8 MiB passes a proxy with a 16 MiB body limit with room; a proxy's 413
  // halves it, down to 1 MiB.
  const CHUNK_SIZE = 8 * MiB
  const MIN_CHUNK_SIZE = 1 * MiB
  // Bounded: about three minutes of trying, then the row says why and
  // offers Retry. The attempt count starts again whenever bytes get through.
  const RETRY_DELAYS = [0, 1000, 3000, 5000, 10000, 20000, 30000, 30000, 30000, 30000]
  const POLL_MS = 15000
  const SPEED_WINDOW_MS = 5000
  const TICKET_RATE_RETRIES = 3

  // REASONS turns every reason code the edge answers (control plane,
  // data plane, the QCOW2 gate) and the page's own into a sentence.
  const REASONS = {
    // tokens and tenants
    unauthorized: 'The token was not accepted. Paste the box\'s tenant token again.',
    notSharing: 'This box does not share its disk with the mesh, so it can neither upload images nor use the machine market. An operator turns sharing on with "vmshelf tenant set NAME --sharing".',
    // the machine market
    notOffered: 'This edge does not offer machines yet: its operator has not turned them on. You can still upload images here.',
    paymentsUnavailable: 'This edge cannot take payments right now (Stripe is not configured or did not answer). Try again later.',
    webhookNotConfigured: 'This edge cannot confirm payments: its Stripe webhook secret is not configured.',
    clusterUnreachable: 'The edge cannot reach its cluster right now; paid machines start once it can.',
    notHosting: 'Only a box in the mesh that shares its disk and hosts machines (with an appliance node) can list machines, and the host of that offer no longer does.',
    noPayoutAccount: 'This box has no Stripe account that can receive payouts, so it cannot list machines.',
    orderUnknown: 'You have no such order: only the buyer of a machine opens its console or cancels its order.',
    replicaUnknown: 'The order has no such machine.',
    replicaNotRunning: 'The machine is not running; its console opens once it runs.',
    consoleBusy: 'Too many consoles are open; close one and try again.',
    badOrigin: 'A machine\'s console opens only from this edge\'s own Machines page.',
    consoleUnavailable: 'This edge reaches no cluster, so it cannot open a machine\'s console.',
    payoutsNotEnabled: 'This box\'s Stripe account cannot receive payouts yet: finish setting up payouts with Stripe on the Machines page ("Set up payouts with Stripe" under "Your listings").',
    accountManagedElsewhere: 'This box\'s Stripe account was set by the edge\'s operator, not made here: its payouts are set up with Stripe directly, or by the operator.',
    badOnboardingURL: 'The edge answered a Stripe onboarding address that is not an https address, so the page does not open it. Tell the edge\'s operator.',
    listingUnknown: 'That offer no longer exists.',
    noCapacity: 'That offer does not have that many replicas free any more.',
    ownListing: 'A box cannot order machines from its own listing.',
    tooManyListings: 'This box already has the most open listings allowed; close one first.',
    tooManyUnpaidOrders: 'This box already has the most orders awaiting payment; pay, cancel or let one expire first.',
    orderNotAwaitingPayment: 'Only an order awaiting payment can be cancelled; this one is not (any more).',
    belowMinimumCharge: 'The price is below the smallest charge Stripe accepts in this currency.',
    paymentRefused: 'The payment provider refused to open the checkout; the order was cancelled.',
    badCheckoutURL: 'The edge answered a checkout address that is not an https address, so the page does not open it. Tell the edge\'s operator; the order expires unpaid.',
    checkoutFailed: 'The checkout could not be opened; the order was cancelled.',
    checkoutExpired: 'The checkout expired before it was paid.',
    buyerCancelled: 'You cancelled the order before paying; its replicas went back to the offer.',
    paymentFailed: 'The payment failed.',
    imageUnknown: 'That image does not exist (any more) on this box.',
    imageInUse: 'An order that is awaiting payment, paid or running uses this image; remove it once the order has ended.',
    needsConsole: 'This system installs from an ISO and needs the browser console, which this edge does not offer yet.',
    userDataNotForInstaller: 'An installation ISO runs its own installer; cloud-init user data cannot be given to it.',
    // uploads: the control plane
    imageQuota: 'This box already holds as many images (counting unfinished uploads and unused tickets) as the edge allows. Remove an image, cancel an unused ticket or an unfinished upload, or let one expire.',
    noSpace: 'The edge\'s disk is full; uploads are refused until space is freed.',
    rateLimited: 'Too many requests in a short time; wait a little and try again.',
    // uploads: the image itself
    notQcow2: 'This file is not a QCOW2 image (version 2 or 3). Convert it with "qemu-img convert -O qcow2".',
    backingFile: 'This image depends on a backing file. Upload a standalone image: "qemu-img convert -O qcow2 in.qcow2 out.qcow2".',
    externalDataFile: 'This image keeps its data in an external file. Upload a standalone image made with "qemu-img convert".',
    encrypted: 'This image is encrypted; the edge cannot start machines from it. Upload an unencrypted image.',
    corrupt: 'This image is marked corrupt or its tables are inconsistent. Repair it with "qemu-img check -r all", or convert it.',
    badHeader: 'This image\'s QCOW2 header is damaged or uses features the edge does not accept.',
    virtualSizeTooLarge: 'The disk inside this image is larger than this edge accepts.',
    tooLarge: 'This file is larger than this edge accepts.',
    unreadable: 'The browser could not read this file.',
    // uploads: the transfer
    proxyTooLarge: 'A proxy in front of the edge refuses even the smallest upload chunks.',
    network: 'The edge could not be reached, even after several tries. Check the connection and press Retry: the upload goes on where it stopped.',
    corsBlocked: 'The browser blocked the upload: the edge answers, but does not let a page at this address send to it.',
    busy: 'The edge is running as many transfers as it may; retrying shortly.',
    shuttingDown: 'The edge is restarting; retrying shortly.',
    locked: 'Another request for this upload is still running; retrying shortly.',
    takenOver: 'Another request took this upload over.',
    offsetMismatch: 'The edge holds a different part of this upload than expected; asking it where to go on.',
    idle: 'The connection stalled.',
    incompleteBody: 'The connection ended before the part arrived.',
    clientGone: 'The connection ended.',
    sessionUnknown: 'The edge no longer knows this upload (it ended, was cancelled or expired after 24 hours).',
    ticketUnknown: 'The upload ticket is not known to the edge.',
    ticketUsed: 'The upload ticket was already used.',
    ticketExpired: 'The upload ticket expired before the upload started.',
    tusVersion: 'The edge speaks a different version of the upload protocol.',
    badContentType: 'The edge refused the upload request\'s content type.',
    // generic answers
    badRequest: 'The edge refused the request as malformed.',
    requestTimeout: 'The request took too long to arrive.',
    repeatedHeader: 'The edge refused the request: it gave a header twice that carries one value (a proxy between the browser and the edge may have added it).',
    ambiguousLength: 'The edge refused the request: its length was given two ways (a proxy between the browser and the edge may have changed it).',
    notFound: 'The edge does not know this address.',
    methodNotAllowed: 'The edge does not accept this request here.',
    unsupportedMediaType: 'The edge wants JSON for this request.',
    internal: 'The edge failed to answer (an internal error). Try again; if it persists, tell its operator.',
    storeCorrupt: 'The edge\'s record store is damaged.',
    storeUnwritable: 'The edge cannot write its records.',
    notReady: 'The edge is not ready.',
    blobStoreUnreachable: 'The edge cannot reach the storage that holds the images. Try again later.',
    storeUnreachable: 'The edge cannot reach its record store right now. Try again in a few seconds.',
    // answers the page never provokes, for completeness
    badSignature: 'The webhook\'s signature did not verify.',
    rangeNotSatisfiable: 'The requested range lies outside the image.',
    tokenUnknown: 'The fetch token is not known, was revoked or has expired.',
    cancelled: 'Cancelled.'
  }

  // The words of a state say what happens next, and who must act: an
  // unpaid order waits for its buyer, not for the edge.
  const ORDER_STATES = {
    awaitingPayment: 'pay now to start',
    paid: 'paid, starting',
    active: 'running',
    expired: 'expired',
    cancelled: 'cancelled',
    refunding: 'Refund under way',
    refundFailed: 'Refund failed; retrying',
    refunded: 'Refunded'
  }
  // Why an order was refunded (its refund.cause), and why a paid order's
  // machines cannot be made (its blocked): the end of a sentence each.
  const REFUND_CAUSES = {
    paidAfterCancel: 'paid after the order was cancelled',
    notProvisioned: 'the machines could not be set up',
    importFailed: 'the image could not be imported'
  }
  // What became of a disputed payment (its dispute_status), in words: open
  // until the buyer's bank decides, then the decision.
  const DISPUTES = {
    open: 'Payment disputed by the buyer\'s bank',
    lost: 'Payment disputed by the buyer\'s bank: the bank gave the payment back to the buyer',
    won: 'Payment disputed by the buyer\'s bank: the bank decided that the payment stands',
    warning_closed: 'The buyer\'s bank asked about the payment and closed its inquiry without a dispute',
    prevented: 'A dispute of the payment by the buyer\'s bank was prevented: the payment stands'
  }
  const BLOCKED = {
    imageGone: 'its image was removed',
    hostGone: 'the host no longer hosts machines',
    clusterRefused: 'the cluster refused the machines',
    importFailed: 'the image could not be imported',
    imageNotOffered: 'its system is no longer offered here'
  }
  const REPLICA_STATES = {
    running: 'running',
    starting: 'starting',
    importing: 'copying the disk',
    paused: 'paused',
    stopped: 'stopped',
    failed: 'failed'
  }
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

  // ---- small DOM helpers: text only, never HTML from data ----

  const $ = (sel) => document.querySelector(sel)
  function el (tag, attrs, ...children) {
    const e = document.createElement(tag)
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue
      if (k.startsWith('data-')) e.setAttribute(k, String(v))
      else if (v === false) continue
      else if (k === 'class') e.className = v
      else if (k === 'text') e.textContent = v
      else if (k in e && typeof v !== 'string') e[k] = v
      else e.setAttribute(k, v === true ? '' : String(v))
    }
    for (const c of children) {
      if (c === null || c === undefined || c === false) continue
      e.append(c instanceof Node ? c : document.createTextNode(String(c)))
    }
    return e
  }
  function show (e, on) { e.hidden = !on }

  function words (reason, fallback) {
    return REASONS[reason] || fallback || (reason ? `The edge refused (${reason}).` : 'The edge refused.')
  }

  // checkoutURL is the checkout address url if the page may send the
  // buyer there: an https URL, or http on a loopback host (a development
  // edge's fake Stripe). Anything else (javascript:, data:, plain http to
  // another host, no URL at all) is null: the address comes from the
  // edge, which relays Stripe's answer, and an href is no place to trust
  // it blindly.
  function checkoutURL (url) {
    let u
    try { u = new URL(url) } catch (e) { return null }
    if (u.username || u.password) return null
    if (u.protocol === 'https:' && u.hostname) return u.href
    if (u.protocol === 'http:' && LOOPBACK.test(u.hostname)) return u.href
    return null
  }
  const LOOPBACK = /^(localhost|127\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[::1\])$/

  // Sizes and times: format.js, the CLI's units and UTC (a stand-in
  // keeps the page readable if it did not load; init says so).
  const FORMAT = window.vmshelfFormat || { bytes: (n) => `${n} B`, when: (t) => String(t || ''), duration: () => '' }
  const bytes = FORMAT.bytes
  const when = FORMAT.when
  const duration = FORMAT.duration
  function fractionDigits (currency) {
    try {
      return new Intl.NumberFormat('en', { style: 'currency', currency }).resolvedOptions().maximumFractionDigits
    } catch (e) {
      return 2
    }
  }
  function money (minor, currency) {
    const cur = (currency || 'eur').toUpperCase()
    const d = fractionDigits(cur)
    const v = minor / 10 ** d
    try {
      return new Intl.NumberFormat(undefined, { style: 'currency', currency: cur }).format(v)
    } catch (e) {
      return `${v.toFixed(d)} ${cur}`
    }
  }

  // ---- the API ----

  const token = {
    get () { try { return sessionStorage.getItem(TOKEN_KEY) || '' } catch (e) { return '' } },
    set (t) { sessionStorage.setItem(TOKEN_KEY, t) },
    forget () { try { sessionStorage.removeItem(TOKEN_KEY) } catch (e) {} }
  }

  // api POSTs body as JSON to the control plane with the token and
  // answers {ok, status, data, reason, error, retryAfter}; a request that
  // got no answer is {ok: false, status: 0, reason: 'network'}.
  async function api (path, body, method) {
    const headers = { Accept: 'application/json' }
    const t = token.get()
    // Only the tenant routes (all POST) get the token; the catalogue is
    // public.
    if (t && (method || 'POST') === 'POST') headers.Authorization = 'Bearer ' + t
    const init = { method: method || 'POST', headers, cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' }
    if (init.method === 'POST') {
      headers['Content-Type'] = 'application/json'
      init.body = JSON.stringify(body || {})
    }
    let res
    try {
      res = await fetch(path, init)
    } catch (e) {
      return { ok: false, status: 0, reason: 'network', error: 'The edge could not be reached.' }
    }
    let data = null
    try { data = await res.json() } catch (e) {}
    const out = { ok: res.ok, status: res.status, data, retryAfter: Number(res.headers.get('Retry-After')) || 0 }
    if (!res.ok) {
      out.reason = (data && data.reason) || (res.status === 401 ? 'unauthorized' : 'http' + res.status)
      out.error = (data && data.error) || `HTTP ${res.status}`
    }
    return out
  }

  // DETAILED are the reasons whose message from the edge says more than
  // the table's sentence (the amounts): the page shows both.
  const DETAILED = new Set(['belowMinimumCharge'])

  function refusal (ans) {
    if (DETAILED.has(ans.reason) && ans.error) {
      return `${words(ans.reason)} ${ans.error.charAt(0).toUpperCase()}${ans.error.slice(1)}.`
    }
    return words(ans.reason, ans.error)
  }

  // ---- page state ----

  const state = {
    status: null,
    limits: Object.assign({}, DEFAULT_LIMITS),
    catalogue: null,
    refreshing: null, // the running refresh's promise
    again: false, // another refresh was asked for while one ran
    pollTimer: 0,
    rendered: false,
    // 'return' once the host came back from Stripe's onboarding (until
    // Stripe confirms the account, the page asks for status every 15 s)
    onboarding: ''
  }

  function setMessage (text, kind) {
    const m = $('#message')
    m.textContent = text || ''
    m.dataset.kind = kind || 'error'
    show(m, !!text)
  }

  // ---- status ----

  function refresh () {
    if (!token.get()) return Promise.resolve()
    if (state.refreshing) {
      state.again = true
      return state.refreshing
    }
    // body[data-loading] marks a status request on its way, for tests and
    // tools that must know the page has settled.
    document.body.dataset.loading = 'true'
    state.refreshing = (async () => {
      try {
        do {
          state.again = false
          await loadOnce()
        } while (state.again && token.get())
      } finally {
        state.refreshing = null
        delete document.body.dataset.loading
      }
    })()
    return state.refreshing
  }

  async function loadOnce () {
    const asked = token.get()
    const [st, cat] = await Promise.all([
      api('/market/vms/status', {}),
      state.catalogue ? Promise.resolve(null) : api('/market/vm-images', null, 'GET')
    ])
    if (cat && cat.ok) state.catalogue = cat.data
    // The token was forgotten or replaced while the answer was on its
    // way: it belongs to a sign-in that has ended, and showing it would
    // put a forgotten tenant's page back on the screen.
    if (token.get() !== asked) return
    if (!st.ok) {
      if (st.status === 401) {
        token.forget()
        showTokenForm(true)
      }
      setMessage(refusal(st))
      schedulePoll(false)
      return
    }
    setMessage('')
    state.status = st.data
    state.limits = Object.assign({}, DEFAULT_LIMITS, st.data.limits || {})
    render()
  }

  function schedulePoll (on) {
    clearTimeout(state.pollTimer)
    state.pollTimer = 0
    if (on) state.pollTimer = setTimeout(refresh, POLL_MS)
  }

  // busy: something is on its way that only the edge moves on (a
  // payment, a replica starting or importing), worth polling for.
  function busy (st) {
    if (state.onboarding === 'return' && st.account && !st.account.payout_account) return true
    return (st.orders || []).some((o) => o.state === 'awaitingPayment' || o.state === 'paid' ||
      (o.replicas || []).some((r) => r.state === 'starting' || r.state === 'importing'))
  }

  function render () {
    const st = state.status
    if (!st) return
    showTokenForm(false)
    const acc = st.account || {}
    const a = $('#account')
    a.textContent = `Box “${acc.name || '?'}”` + (acc.in_mesh ? ', in the mesh' : '') + (acc.sharing ? ', sharing' : ', not sharing') +
      (acc.hosts_vms ? ', hosts machines' : '')
    show(a, true)

    const un = $('#unavailable')
    if (st.available === false) {
      un.textContent = words(st.reason)
      un.dataset.reason = st.reason || ''
      show(un, true)
    } else {
      un.textContent = ''
      delete un.dataset.reason
      show(un, false)
    }
    // A trial edge (serve --dev, its Stripe a stand-in on this machine)
    // says so before anyone pays.
    show($('#demo-payments'), st.demo_payments === true)
    renderImages(st)
    renderCatalogue()
    const market = st.available !== false
    show($('#market'), market)
    if (market) {
      renderOffers(st)
      renderOrderForm(st)
    }
    renderListings(st, market)
    renderMachines(st, market)
    arrange(st, market)
    uploads.renderSessions(st.sessions || [])
    if (!state.rendered) {
      state.rendered = true
      document.body.dataset.ready = 'true'
    }
    schedulePoll(busy(st))
  }

  // renderImages shows the images, the quota and what counts against it
  // (the edge counts stored images, unfinished uploads and unused tickets
  // alike), and at the quota closes the file input with what to do, so no
  // file is chosen only to be refused.
  function renderImages (st) {
    const images = st.images || []
    const sessions = st.sessions || []
    const tickets = st.tickets || []
    const limit = state.limits.images_per_tenant
    const used = images.length + sessions.length + tickets.length
    const q = $('#image-quota')
    q.dataset.used = String(used)
    q.dataset.limit = String(limit)
    const parts = []
    if (sessions.length) parts.push(count(sessions.length, 'unfinished upload', 'unfinished uploads'))
    if (tickets.length) parts.push(count(tickets.length, 'unused ticket', 'unused tickets'))
    q.textContent = `${used} of ${limit} ${limit === 1 ? 'image' : 'images'}` +
      (parts.length ? ` (counting ${parts.join(' and ')})` : '') +
      ` · files up to ${bytes(state.limits.upload_max_bytes)}, disks up to ${bytes(state.limits.max_virtual_bytes)}`
    const list = $('#image-list')
    list.replaceChildren(...images.map((img) => el('li', { 'data-upload-id': img.upload_id },
      el('div', { class: 'card-head' },
        el('span', { class: 'image-name', text: img.name }),
        el('span', { class: 'image-efi', text: img.efi ? 'starts with UEFI' : 'starts with BIOS' })),
      el('p', { class: 'meta' },
        el('span', { class: 'image-size', text: `${bytes(img.size)} (${img.size} bytes)` }),
        ` · disk ${bytes(img.virtual_size)} · uploaded ${when(img.created_at)}`),
      el('p', { class: 'meta' }, 'SHA-256 ', el('code', { class: 'image-sha256', text: img.sha256 })),
      el('div', { class: 'actions' },
        el('button', { type: 'button', class: 'image-remove', 'aria-label': `Remove image ${img.name}`, text: 'Remove', 'data-upload-id': img.upload_id })))))
    show($('#image-empty'), images.length === 0)
    renderTickets(tickets)
    const sharing = !st.account || st.account.sharing !== false
    show($('#upload-form'), sharing)
    atQuota(used >= limit, { images: images.length, sessions: sessions.length, tickets: tickets.length, limit })
  }

  function count (n, one, many) {
    return `${n} ${n === 1 ? one : many}`
  }

  // atQuota disables choosing and uploading files while the box holds as
  // many images as the edge allows, and says what frees a place.
  function atQuota (full, n) {
    const input = $('#upload-file')
    const note = $('#upload-full')
    input.disabled = full
    $('#upload-start').disabled = full
    $('#upload-form').dataset.full = String(full)
    if (!full) {
      note.textContent = ''
      show(note, false)
      return
    }
    const ways = []
    if (n.images) ways.push('remove an image')
    if (n.tickets) ways.push('cancel an unused ticket')
    if (n.sessions) ways.push('cancel an unfinished upload or let it expire (24 hours after its last byte)')
    if (!ways.length) ways.push('wait until an upload of this box ends')
    const last = ways.length > 1 ? `${ways.slice(0, -1).join(', ')} or ${ways[ways.length - 1]}` : ways[0]
    note.textContent = `This box holds ${n.limit} of ${n.limit} images, as many as this edge allows, so no file can be uploaded now. To upload one, ${last}.`
    show(note, true)
  }

  // renderTickets lists the unused tickets no row of this page is about
  // to use: each holds a place of the quota until it expires or is
  // cancelled.
  function renderTickets (tickets) {
    const busy = uploads.busyIds()
    const list = $('#ticket-list')
    const shown = tickets.filter((tk) => !busy.has(tk.upload_id))
    list.replaceChildren(...shown.map((tk) => el('li', { class: 'ticket', 'data-upload-id': tk.upload_id },
      el('div', { class: 'card-head' },
        el('span', { class: 'ticket-name', text: `Ticket for “${tk.name}”` }),
        el('span', { class: 'meta', text: tk.efi ? 'starts with UEFI' : 'starts with BIOS' })),
      el('p', { class: 'meta' }, 'Unused: it holds a place of the quota until ',
        el('span', { class: 'ticket-expires', text: when(tk.expires_at) }), ' unless cancelled.'),
      el('div', { class: 'actions' },
        el('button', { type: 'button', class: 'ticket-cancel', 'data-upload-id': tk.upload_id,
          'aria-label': `Cancel the unused ticket for ${tk.name}`, text: 'Cancel ticket' })))))
    show(list, shown.length > 0)
  }

  // What a catalogue entry starts from, by its source; an installation
  // ISO is installed by its buyer through the machine's console.
  const SOURCE_NAMES = { losos: 'registry disk', iso: 'installation ISO, installed through the console' }

  function renderCatalogue () {
    const c = state.catalogue || { catalogue: [], not_offered: [] }
    $('#catalogue-list').replaceChildren(...(c.catalogue || []).map((e) => el('li', { 'data-image-id': e.id },
      el('span', { class: 'catalogue-name', text: e.name }),
      el('span', { class: 'meta', text: `${SOURCE_NAMES[e.source] || 'cloud image'} · ${e.efi ? 'UEFI' : 'BIOS'}` }),
      el('span', { class: 'meta catalogue-needs',
        text: [e.min_memory_mib ? `memory ≥ ${bytes(e.min_memory_mib * MiB)}` : '',
          e.min_disk_gib ? `disk ≥ ${bytes(e.min_disk_gib * GiB)}` : ''].filter(Boolean).join(' · ') || 'no minimum' }))))
    const no = c.not_offered || []
    $('#not-offered-count').textContent = String(no.length)
    show($('#not-offered-box'), no.length > 0)
    $('#not-offered').replaceChildren(...no.map((n) => el('li', {},
      el('strong', { class: 'not-offered-name', text: n.name }), ': ', el('span', { class: 'not-offered-reason', text: n.reason }))))
  }

  // sizeWords is one replica's size in words ({vcpu, memory_mib,
  // disk_gib}, as offers carry it); '' when the edge sent none.
  function sizeWords (z) {
    if (!z || !z.vcpu) return ''
    return `${z.vcpu} vCPU${z.vcpu === 1 ? '' : 's'}, ${bytes(z.memory_mib * MiB)} memory, ${bytes(z.disk_gib * GiB)} disk`
  }

  function renderOffers (st) {
    const offers = st.offers || []
    $('#offer-list').replaceChildren(...offers.map((o) => el('li', { 'data-listing-id': o.listing_id, 'data-free': o.free },
      el('div', { class: 'card-head' }, el('span', { class: 'offer-host', text: o.host }),
        el('span', { class: 'offer-price', text: `${money(o.unit_price, o.currency)} per replica-month` })),
      el('p', { class: 'meta offer-size', text: `Each replica: ${sizeWords(o)}, more where the system needs it`, hidden: !sizeWords(o) }),
      el('p', { class: 'meta offer-free', text: `${o.free} of ${o.capacity} replicas free` }))))
    show($('#offer-empty'), offers.length === 0)
  }

  // keepSelect refills a select, keeping the user's choice where it is
  // still there.
  function keepSelect (sel, groups) {
    const before = sel.value
    sel.replaceChildren(...groups)
    if ([...sel.options].some((o) => o.value === before)) sel.value = before
  }

  function renderOrderForm (st) {
    const c = (state.catalogue && state.catalogue.catalogue) || []
    const own = st.images || []
    const groups = []
    if (c.length) {
      groups.push(el('optgroup', { label: 'Systems' }, ...c.map((e) => el('option', { value: e.id, text: e.name }))))
    }
    if (own.length) {
      groups.push(el('optgroup', { label: 'Your images' }, ...own.map((i) =>
        el('option', { value: i.upload_id, 'data-efi': i.efi, text: `${i.name} (${i.efi ? 'starts with UEFI' : 'starts with BIOS'})` }))))
    }
    keepSelect($('#order-image'), groups)
    const offers = (st.offers || []).filter((o) => o.free > 0)
    keepSelect($('#order-listing'), offers.map((o) => el('option', { value: o.listing_id, 'data-free': o.free,
      text: `${o.host}: ${money(o.unit_price, o.currency)} per replica-month, ${o.free} free` })))
    let why = ''
    if (groups.length === 0) why = 'noImage'
    else if ((st.offers || []).length === 0) why = 'noOffers'
    else if (offers.length === 0) why = 'full'
    orderDisabled(why)
    orderChosen()
  }

  // ORDER_DISABLED says why "Order and pay" is off, beside the button
  // (its aria-describedby), by what is missing.
  const ORDER_DISABLED = {
    noImage: 'Nothing to start a machine from: this edge offers no system and this box has no image yet. Upload one above.',
    noOffers: 'No other box offers machines right now, so there is nothing to order.',
    full: 'Every offer is full: all its replicas are running or reserved by orders awaiting payment. They come back when such an order is cancelled or its checkout expires.'
  }

  // orderDisabled turns "Order and pay" off for why (a key of
  // ORDER_DISABLED), saying so, or on ('').
  function orderDisabled (why) {
    const b = $('#order-submit')
    const p = $('#order-disabled')
    b.disabled = !!why
    p.textContent = ORDER_DISABLED[why] || ''
    if (why) p.dataset.why = why
    else delete p.dataset.why
    show(p, !!why)
  }

  // neededSize is one replica of offer started from image id: the offer's
  // size, with the memory and disk the catalogue says the system needs,
  // and a disk at least as large as an own image's.
  function neededSize (offer, id) {
    if (!offer.vcpu) return ''
    let mem = offer.memory_mib
    let disk = offer.disk_gib
    const c = ((state.catalogue && state.catalogue.catalogue) || []).find((e) => e.id === id)
    if (c) {
      mem = Math.max(mem, c.min_memory_mib || 0)
      disk = Math.max(disk, c.min_disk_gib || 0)
    }
    const img = ((state.status && state.status.images) || []).find((i) => i.upload_id === id)
    if (img) disk = Math.max(disk, Math.ceil(img.virtual_size / GiB))
    return sizeWords({ vcpu: offer.vcpu, memory_mib: mem, disk_gib: disk })
  }

  // orderChosen follows the order form's choices: the replicas the chosen
  // offer has free bound the quantity, and #order-summary says before
  // paying what the order buys: each replica's size and the total, the
  // quantity times the price per replica-month.
  function orderChosen () {
    const sel = $('#order-listing').selectedOptions[0]
    $('#order-quantity').max = String(Math.min(10, sel ? Number(sel.dataset.free) : 10))
    const sum = $('#order-summary')
    const offer = ((state.status && state.status.offers) || []).find((o) => o.listing_id === $('#order-listing').value)
    const q = Number($('#order-quantity').value)
    if (!offer || !Number.isInteger(q) || q < 1) {
      sum.textContent = ''
      delete sum.dataset.total
      show(sum, false)
      return
    }
    const size = neededSize(offer, $('#order-image').value)
    const total = offer.unit_price * q
    sum.dataset.total = String(total)
    sum.dataset.currency = offer.currency
    sum.textContent = (size ? `Each replica: ${size}. ` : '') +
      `Total: ${q} × ${money(offer.unit_price, offer.currency)} = ${money(total, offer.currency)} for one month, paid at Stripe Checkout.`
    show(sum, true)
  }

  function currencyOf (st) {
    const l = (st.listings || [])[0] || (st.offers || [])[0]
    return (l && l.currency) || st.currency || 'eur'
  }

  function renderListings (st, market) {
    const acc = st.account || {}
    const sec = $('#listings')
    show(sec, market && !!acc.hosts_vms)
    if (!market || !acc.hosts_vms) return
    let why = ''
    if (!acc.in_mesh) why = 'This box cannot list machines: it is not in the mesh.'
    else if (!acc.sharing) why = 'This box cannot list machines: it does not share its disk.'
    else if (!acc.appliance) why = 'This box cannot list machines: it has no appliance node to run them on.'
    else if (!acc.payout_account) why = 'This box cannot list machines until its Stripe account can receive payouts.'
    const unable = $('#listing-unable')
    unable.textContent = why
    show(unable, !!why)
    show($('#listing-form'), !why)
    renderPayouts(acc, !!why && acc.in_mesh && acc.sharing && !!acc.appliance)
    const cur = currencyOf(st)
    $('#listing-price-label').textContent = `Price per replica-month (${cur.toUpperCase()})`
    listingFee()
    $('#listing-list').replaceChildren(...(st.listings || []).map((l) => el('li', { 'data-listing-id': l.listing_id, 'data-open': l.open },
      el('div', { class: 'card-head' },
        el('span', { class: 'listing-price', text: `${money(l.unit_price, l.currency)} per replica-month` }),
        el('span', { class: 'listing-open', text: l.open ? 'open' : 'closed' })),
      el('p', { class: 'meta', text: `${l.capacity} replicas: ${l.free} free, ${l.reserved} reserved, ${l.running} running · listed ${when(l.created_at)}` }),
      l.open ? el('div', { class: 'actions' }, el('button', { type: 'button', class: 'listing-close', 'data-listing-id': l.listing_id,
        'aria-label': `Close the listing at ${money(l.unit_price, l.currency)}`, text: 'Close' })) : null)))
  }

  // payoutState is the box's payout account in words: none yet, made by
  // onboarding but not finished (Stripe has not enabled charges and
  // payouts), ready, or one the edge's operator set.
  function payoutState (acc) {
    if (acc.stripe_onboarded) {
      if (acc.stripe_charges_enabled && acc.stripe_payouts_enabled) return ['enabled', 'Payouts: charges and payouts enabled with Stripe.']
      const missing = [acc.stripe_charges_enabled ? '' : 'charges', acc.stripe_payouts_enabled ? '' : 'payouts'].filter(Boolean).join(' and ')
      return ['pending', `Payouts: onboarding with Stripe not finished (${missing} not enabled yet).`]
    }
    if (acc.payout_account) return ['operator', 'Payouts: through the Stripe account the edge\'s operator set for this box.']
    return ['none', 'Payouts: no Stripe account yet.']
  }

  // renderPayouts shows the payout account's state to a host, and the
  // button to Stripe's onboarding when the host could list but for it.
  function renderPayouts (acc, blocked) {
    const [st, text] = payoutState(acc)
    const ps = $('#payout-state')
    ps.textContent = text
    ps.dataset.state = st
    show($('#payouts'), true)
    const start = $('#onboarding-start')
    show(start, blocked && st !== 'operator')
    start.textContent = st === 'pending' ? 'Continue setting up payouts with Stripe' : 'Set up payouts with Stripe'
    const res = $('#onboarding-result')
    if (state.onboarding === 'return') {
      res.textContent = 'Back from Stripe: ' + (st === 'enabled'
        ? 'charges and payouts are enabled; this box can list machines.'
        : 'Stripe has not confirmed that this box can receive payouts yet (it may still be checking the details, or the onboarding is not finished). This page asks again every 15 seconds.')
      res.dataset.state = st === 'enabled' ? 'done' : 'pending'
      show(res, true)
      if (st === 'enabled') state.onboarding = 'done'
    }
  }

  // startOnboarding asks the edge for a link to Stripe's onboarding of
  // this box's account (made now if it has none) and goes there in this
  // tab: Stripe sends the host back to this page. The address is checked
  // as a checkout's is.
  async function startOnboarding () {
    const btn = $('#onboarding-start')
    const res = $('#onboarding-result')
    btn.disabled = true
    res.textContent = 'Asking the edge for a link to Stripe…'
    res.dataset.state = 'pending'
    delete res.dataset.reason
    show(res, true)
    const ans = await api('/market/stripe/onboarding', {})
    const url = ans.ok ? checkoutURL(ans.data && ans.data.url) : null
    if (!url) {
      btn.disabled = false
      const reason = ans.ok ? 'badOnboardingURL' : ans.reason
      res.textContent = 'No link to Stripe: ' + (ans.ok ? words(reason) : refusal(ans))
      res.dataset.state = 'refused'
      res.dataset.reason = reason
      await refresh()
      return
    }
    res.textContent = 'Opening Stripe…'
    res.dataset.state = 'leaving'
    location.assign(url)
  }

  // orderNotes are an order's refund, dispute and blocked states in words.
  function orderNotes (o) {
    const notes = []
    if (o.disputed_at) {
      const status = o.dispute_status || 'open'
      notes.push(el('p', { class: 'order-disputed', 'data-dispute': status,
        text: (DISPUTES[status] || `${DISPUTES.open} (${status})`) + (o.dispute_closed_at ? ` · decided ${when(o.dispute_closed_at)}` : '') }))
    }
    if (o.refund && o.refund.cause) {
      notes.push(el('p', { class: 'order-refund', 'data-cause': o.refund.cause,
        text: `Refund: ${REFUND_CAUSES[o.refund.cause] || o.refund.cause}.` }))
    }
    if (o.refund && o.refund.held_by_dispute) {
      notes.push(el('p', { class: 'order-refund-held notice',
        text: 'The refund is held: the payment is disputed, so the buyer\'s bank, not this edge, decides whether it goes back.' }))
    }
    if (o.blocked) {
      notes.push(el('p', { class: 'order-blocked notice', 'data-blocked': o.blocked,
        text: `The machines cannot be made: ${BLOCKED[o.blocked] || o.blocked}.` }))
    }
    return notes
  }

  // imageLabel names an order's image as the user knows it.
  function imageLabel (st, o) {
    if (o.image_kind === 'upload') {
      const img = (st.images || []).find((i) => i.upload_id === o.image)
      return img ? `your image “${img.name}”` : `your image ${o.image} (removed)`
    }
    const c = ((state.catalogue && state.catalogue.catalogue) || []).find((e) => e.id === o.image)
    return c ? c.name : o.image
  }

  // payLink is the card's link to an unpaid order's checkout, or the
  // reason in words when its address is not one to follow.
  function payLink (o) {
    if (!o.checkout_url) return null
    const url = checkoutURL(o.checkout_url)
    if (!url) return el('p', { class: 'order-pay-refused notice', text: words('badCheckoutURL') })
    return el('p', {}, el('a', { href: url, target: '_blank', rel: 'noopener noreferrer', class: 'order-pay', text: 'Pay now at Stripe' }))
  }

  // arrange puts what the box has first: its machines (the orders it
  // bought) and, for a host, its listings; then images, the market and the
  // systems, and last what it has none of (an empty "Your machines", the
  // listing form of a host without listings). Where nothing can be
  // ordered the systems are only a reference and go last, after the
  // box's own machines. Only the sections out of place move, and the focus
  // is put back where it was if a move took it.
  function arrange (st, market) {
    const acc = st.account || {}
    const first = []
    if ((st.orders || []).length > 0) first.push('machines')
    if (market && acc.hosts_vms && (st.listings || []).length > 0) first.push('listings')
    const rest = ['listings', 'machines'].filter((id) => !first.includes(id))
    const ids = [...first, 'images', 'market', ...(market ? ['catalogue', ...rest] : [...rest, 'catalogue'])]
    $('#app').dataset.first = ids[0]
    const focused = document.activeElement
    let ref = $('#unavailable')
    for (const id of ids) {
      const e = document.getElementById(id)
      if (ref.nextElementSibling !== e) ref.after(e)
      ref = e
    }
    if (focused && focused !== document.activeElement && focused.isConnected) focused.focus({ preventScroll: true })
  }

  function renderMachines (st, market) {
    const orders = st.orders || []
    $('#machine-empty').textContent = 'No machines yet.' + (market ? ' Order some under “Order machines” above.' : '')
    $('#machine-list').replaceChildren(...orders.map((o) => {
      const note = o.note || (o.state === 'cancelled' && o.reason ? words(o.reason) : '')
      const replicas = o.replicas || []
      return el('li', { 'data-order-id': o.order_id, 'data-state': o.state },
        el('div', { class: 'card-head' },
          el('span', { class: 'order-name', text: o.name }),
          el('span', { class: 'order-state state', 'data-state': o.state,
            text: o.refund && o.refund.held_by_dispute ? 'Refund held: payment disputed' : ORDER_STATES[o.state] || o.state })),
        el('p', { class: 'meta' }, `${o.quantity} × ${imageLabel(st, o)} on ${o.host} · ${money(o.total, o.currency)} · ordered ${when(o.created_at)}`),
        el('p', { class: 'meta' }, 'Address: ', el('span', { class: 'order-address', text: o.address || 'no public address on this edge: use the console' })),
        el('p', { class: 'meta' }, 'Paid until: ', el('span', { class: 'order-expires', text: o.expires_at ? when(o.expires_at) : 'not paid yet' })),
        payLink(o),
        o.state === 'awaitingPayment' ? el('div', { class: 'actions' }, el('button', { type: 'button', class: 'order-cancel',
          'data-order-id': o.order_id, 'aria-label': `Cancel the unpaid order ${o.name}`, text: 'Cancel order' })) : null,
        ...orderNotes(o),
        el('p', { class: 'order-note', text: note, hidden: !note }),
        replicas.length ? el('ul', { class: 'replicas', 'aria-label': `Replicas of ${o.name}` }, ...replicas.map((r, i) =>
          el('li', { class: 'replica', 'data-replica': r.name, 'data-state': r.state },
            el('span', { class: 'replica-name', text: r.name }),
            el('span', { class: 'replica-state state', 'data-state': r.state,
              text: (REPLICA_STATES[r.state] || r.state) + (r.progress ? ` ${r.progress}` : '') + (r.detail ? ` (${r.detail})` : '') }),
            ...consoleButtons(o, r, i)))) : null)
    }))
    show($('#machine-empty'), orders.length === 0)
  }

  // consoleButtons open the screen or the serial line of a running
  // replica of an active order (the only ones the edge opens a console
  // for); the console itself is console.js's.
  function consoleButtons (o, r, i) {
    if (o.state !== 'active' || r.state !== 'running' || !window.vmshelfConsole) return []
    const button = (kind, cls, text) => {
      const b = el('button', { type: 'button', class: cls, text, 'aria-label': `${text} of ${r.name}` })
      b.addEventListener('click', () => openConsole(o, r, i, kind))
      return b
    }
    return [el('span', { class: 'replica-consoles' },
      button('vnc', 'replica-console', 'Console'), button('serial', 'replica-serial', 'Serial console'))]
  }

  // openConsole asks console.js to show a console; its tickets are asked
  // for here, with the token, each time it connects (once, and again on
  // Reconnect): a ticket is good for one connection.
  function openConsole (o, r, i, kind) {
    window.vmshelfConsole.open({
      kind,
      title: `${r.name} of ${o.name}`,
      ticket: async () => {
        const ans = await api('/market/vms/console/ticket', { order_id: o.order_id, replica: i, kind })
        if (!ans.ok) {
          const e = new Error(refusal(ans))
          e.reason = ans.reason || String(ans.status)
          throw e
        }
        return ans.data.url
      }
    })
  }

  // ---- token ----

  function showTokenForm (on) {
    show($('#token-form'), true)
    $('#token-save').hidden = !on
    $('#token').closest('.row').hidden = false
    $('#token').hidden = !on
    $('label[for=token]').hidden = !on
    $('#token-help').hidden = !on
    $('#token-forget').hidden = on
    show($('#app'), !on)
    show($('#refresh'), !on)
    if (on) {
      show($('#account'), false)
      schedulePoll(false)
    }
  }

  // ---- actions ----

  // removeImage asks first: a removed image is gone from the edge (its
  // file deleted, its fetch tokens revoked) and cannot be undone. The first
  // press turns the button into "Remove for good" beside a "Keep" button;
  // only the second press sends the request.
  async function removeImage (btn) {
    if (btn.dataset.confirm !== 'true') {
      btn.dataset.confirm = 'true'
      btn.textContent = 'Remove for good'
      const keep = el('button', { type: 'button', class: 'image-keep', text: 'Keep', 'aria-label': 'Keep the image' })
      keep.addEventListener('click', () => {
        keep.remove()
        btn.dataset.confirm = 'false'
        btn.textContent = 'Remove'
        btn.focus()
      })
      btn.after(keep)
      setMessage('Removing deletes the image from the edge; it cannot be undone. Press "Remove for good" to go on.', 'info')
      return
    }
    btn.disabled = true
    const ans = await api('/market/vm-images/remove', { upload_id: btn.dataset.uploadId })
    if (!ans.ok) {
      setMessage('The image was not removed: ' + refusal(ans))
      btn.disabled = false
    } else {
      setMessage('The image was removed.', 'info')
    }
    await refresh()
  }

  // cancelTicket gives an unused ticket's place in the quota back: the
  // ticket can no longer start an upload.
  async function cancelTicket (btn) {
    btn.disabled = true
    const ans = await api('/market/vm-images/ticket/cancel', { upload_id: btn.dataset.uploadId })
    if (!ans.ok) btn.disabled = false
    // After the refresh, whose answer clears the message.
    await refresh()
    if (!ans.ok) {
      setMessage('The ticket was not cancelled: ' + refusal(ans))
      return
    }
    setMessage('The ticket was cancelled; its place in the quota is free.', 'info')
    if (!$('#upload-file').disabled) $('#upload-file').focus()
  }

  // cancelOrder cancels an order awaiting payment: its replicas go back to
  // the offer at once and its checkout can be paid no more (one paid in
  // the moment before is refunded by the edge).
  async function cancelOrder (btn) {
    btn.disabled = true
    const ans = await api('/market/vms/orders/cancel', { order_id: btn.dataset.orderId })
    // After the refresh, whose answer clears the message.
    await refresh()
    if (!ans.ok) {
      btn.disabled = false
      setMessage('The order was not cancelled: ' + refusal(ans))
      return
    }
    const o = ans.data || {}
    setMessage(o.state === 'cancelled'
      ? `The order “${o.name}” is cancelled; its ${count(o.quantity, 'replica is', 'replicas are')} free again.`
      : `The order “${o.name}” is cancelled, but it had been paid a moment before: the payment is refunded.`, 'info')
  }

  async function closeListing (btn) {
    btn.disabled = true
    const ans = await api('/market/vms/listings/close', { listing_id: btn.dataset.listingId })
    const res = $('#listing-result')
    res.textContent = ans.ok ? 'The listing is closed; orders already placed go on.' : 'The listing was not closed: ' + refusal(ans)
    res.dataset.state = ans.ok ? 'done' : 'refused'
    res.dataset.reason = ans.ok ? '' : ans.reason
    show(res, true)
    await refresh()
  }

  function parsePrice (text, currency) {
    const d = fractionDigits(currency.toUpperCase())
    const m = /^\s*(\d{1,7})(?:[.,](\d+))?\s*$/.exec(text)
    if (!m || (m[2] && m[2].length > d)) return NaN
    return Number(m[1]) * 10 ** d + Number((m[2] || '').padEnd(d, '0') || 0)
  }

  // listingFee tells the host, under the price, that half of each sale is
  // the platform's fee and what it receives of the price typed: the
  // platform's half is rounded down to the cent (billing.Split).
  function listingFee () {
    const cur = currencyOf(state.status || {})
    const price = parsePrice($('#listing-price').value, cur)
    const p = $('#listing-fee')
    let text = 'Half of each sale goes to the platform as its fee (rounded down to the cent); you receive the other half.'
    if (Number.isInteger(price) && price > 0) {
      const yours = price - Math.floor(price / 2)
      text = `Half of each sale goes to the platform as its fee: at ${money(price, cur)} per replica-month you receive ` +
        `${money(yours, cur)} per replica-month, the platform ${money(price - yours, cur)} (its half of an order's total is rounded down to the cent).`
      p.dataset.receive = String(yours)
    } else {
      delete p.dataset.receive
    }
    p.textContent = text
  }

  async function createListing (ev) {
    ev.preventDefault()
    const res = $('#listing-result')
    const cur = currencyOf(state.status || {})
    const price = parsePrice($('#listing-price').value, cur)
    const capacity = Number($('#listing-capacity').value)
    let problem = ''
    if (!Number.isInteger(price)) problem = `Write the price in ${cur.toUpperCase()}, like 6.00.`
    else if (!Number.isInteger(capacity) || capacity < 1 || capacity > 50) problem = 'Offer 1 to 50 replicas.'
    if (problem) {
      res.textContent = problem
      res.dataset.state = 'refused'
      res.dataset.reason = 'badRequest'
      show(res, true)
      return
    }
    $('#listing-submit').disabled = true
    const ans = await api('/market/vms/listings', { unit_price: price, capacity })
    $('#listing-submit').disabled = false
    res.textContent = ans.ok ? `Listed ${capacity} replicas at ${money(price, cur)} per replica-month.` : 'Not listed: ' + refusal(ans)
    res.dataset.state = ans.ok ? 'done' : 'refused'
    res.dataset.reason = ans.ok ? '' : ans.reason
    show(res, true)
    await refresh()
  }

  const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/

  // isInstaller: the image is a catalogue installation ISO, which takes
  // no cloud-init.
  function isInstaller (id) {
    return ((state.catalogue && state.catalogue.catalogue) || []).some((e) => e.id === id && e.source === 'iso')
  }

  async function placeOrder (ev) {
    ev.preventDefault()
    const res = $('#order-result')
    const req = {
      image: $('#order-image').value,
      name: $('#order-name').value.trim(),
      listing_id: $('#order-listing').value,
      quantity: Number($('#order-quantity').value),
      user_data: $('#order-user-data').value
    }
    const ud = req.user_data
    let problem = ''
    if (!req.image) problem = 'Choose a system or one of your images.'
    else if (!DNS_LABEL.test(req.name) || req.name.length > 63) problem = 'The name must be 1 to 63 lower-case letters, digits and “-”, starting and ending with a letter or digit.'
    else if (!req.listing_id) problem = 'Choose an offer.'
    else if (!Number.isInteger(req.quantity) || req.quantity < 1 || req.quantity > Number($('#order-quantity').max || 10)) problem = `Order 1 to ${$('#order-quantity').max || 10} replicas.`
    else if (ud && isInstaller(req.image)) problem = REASONS.userDataNotForInstaller
    else if (ud && !ud.startsWith('#cloud-config') && !ud.startsWith('#!')) problem = 'Cloud-init must start with #cloud-config or #!.'
    else if (new TextEncoder().encode(ud).length > 16384) problem = 'Cloud-init must be at most 16 KiB.'
    if (problem) {
      res.replaceChildren(problem)
      res.dataset.state = 'refused'
      res.dataset.reason = 'badRequest'
      show(res, true)
      return
    }
    if (!ud) delete req.user_data
    // Opened now, inside the submit's user gesture, so no popup blocker
    // stops it; it is sent to the checkout once the edge answers.
    let win = null
    try { win = window.open('', '_blank') } catch (e) {}
    if (win) {
      try { win.document.title = 'Opening Stripe Checkout…' } catch (e) {}
    }
    $('#order-submit').disabled = true
    res.replaceChildren('Placing the order…')
    res.dataset.state = 'pending'
    delete res.dataset.reason
    show(res, true)
    const ans = await api('/market/vms/orders', req)
    $('#order-submit').disabled = false
    if (!ans.ok) {
      if (win) win.close()
      res.replaceChildren('The order was not placed: ' + refusal(ans))
      res.dataset.state = 'refused'
      res.dataset.reason = ans.reason
      await refresh()
      return
    }
    const o = ans.data
    const url = checkoutURL(o.checkout_url)
    if (!url) {
      if (win) win.close()
      res.replaceChildren(`Order ${o.order_id} placed, but: ${words('badCheckoutURL')}`)
      res.dataset.state = 'refused'
      res.dataset.reason = 'badCheckoutURL'
      res.dataset.orderId = o.order_id
      await refresh()
      return
    }
    const link = el('a', { id: 'order-checkout', href: url, target: '_blank', rel: 'noopener noreferrer', text: 'Pay at Stripe Checkout' })
    res.replaceChildren(`Order ${o.order_id} placed: ${money(o.total, o.currency)}, payable until ${when(o.expires_at)}. `, link,
      win ? ' (opened in a new tab)' : ' (your browser blocked the new tab: follow the link)')
    res.dataset.state = 'placed'
    res.dataset.orderId = o.order_id
    if (win) {
      try {
        win.opener = null
        win.location.href = url
      } catch (e) {}
    }
    await refresh()
  }

  // ---- uploads ----

  const uploads = (function () {
    const rows = new Map() // key → Transfer
    let seq = 0

    function fingerprint (file) {
      return `vmshelf:${location.origin}/${file.name}/${file.size}/${file.lastModified}`
    }
    function imageName (file) {
      const n = file.name.replace(/\.qcow2$/i, '').trim()
      return n || file.name
    }
    function live (text) {
      $('#upload-live').textContent = text
    }
    function storedUploads () {
      const s = window.tus && window.tus.defaultOptions && window.tus.defaultOptions.urlStorage
      if (!s || !s.findAllUploads) return Promise.resolve([])
      return s.findAllUploads().catch(() => [])
    }
    function running () {
      let n = 0
      for (const t of rows.values()) if (t.active) n++
      return n
    }
    function pump () {
      for (const t of rows.values()) {
        if (running() >= Math.max(1, state.limits.max_transfers)) return
        if (t.state === 'waiting' && t.queued) t.begin()
      }
    }

    class Transfer {
      constructor (file, efi) {
        this.key = 'u' + (++seq)
        this.file = file
        this.efi = efi
        this.state = ''
        this.active = false // counts against max_transfers
        this.queued = false
        this.upload = null
        this.resumed = false
        this.samples = []
        this.lastAnnounced = -1
        this.renewed = false // a fresh ticket after a lost session, once
        this.proxyHeadOK = 0
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

      set (st, text, reason) {
        const changed = st !== this.state
        this.state = st
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

      setUploadId (id) {
        if (id) {
          this.uploadId = id
          this.li.dataset.uploadId = id
        }
      }

      async check () {
        this.set('checking', 'reading the header')
        const v = await window.vmshelfQcow2.checkFile(this.file, {
          maxVirtualBytes: state.limits.max_virtual_bytes, uploadMaxBytes: state.limits.upload_max_bytes
        })
        if (this.state === 'cancelled') return
        if (!v.ok) {
          this.retryable = false
          let text = words(v.reason, v.message)
          if (v.reason === 'tooLarge') text = `This file (${bytes(this.file.size)}) is larger than the ${bytes(state.limits.upload_max_bytes)} this edge accepts.`
          if (v.reason === 'virtualSizeTooLarge') text = `The disk inside this image (${bytes(v.virtualSize)}) is larger than the ${bytes(state.limits.max_virtual_bytes)} this edge accepts.`
          this.set('refused', text, v.reason)
          return
        }
        this.info = v
        this.queued = true
        this.set('waiting', `QCOW2 v${v.version}, disk ${bytes(v.virtualSize)}; waiting for a free transfer slot`)
        pump()
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
          fingerprint: (file) => Promise.resolve(fingerprint(file)),
          onProgress: (sent, total) => t.progress(sent, total),
          onAfterResponse: (req, res) => t.afterResponse(req, res),
          onShouldRetry: (err, attempt, opts) => t.shouldRetry(err, attempt, opts),
          onError: (err) => t.error(err),
          onSuccess: () => t.success()
        }
      }

      async start () {
        const opts = this.options()
        const up = new window.tus.Upload(this.file, opts)
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
          const ans = await api('/market/vm-images/ticket', { name, efi: this.efi })
          if (this.state === 'cancelled') return null
          if (ans.ok) return ans.data
          if (ans.reason === 'rateLimited' && i < TICKET_RATE_RETRIES) {
            const wait = Math.min(30, Math.max(1, ans.retryAfter || 2))
            this.set('retrying', `too many tickets at once; asking again in ${wait} s`, 'rateLimited')
            await new Promise((resolve) => setTimeout(resolve, wait * 1000))
            continue
          }
          this.upload = null
          this.retryable = ans.reason === 'network' || ans.reason === 'noSpace' || ans.reason === 'imageQuota' || ans.status >= 500
          this.fail(ans.reason, refusal(ans))
          return null
        }
      }

      progress (sent, total) {
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

      afterResponse (req, res) {
        const method = req.getMethod()
        const status = res.getStatus()
        const offHeader = res.getHeader('Upload-Offset')
        if (offHeader !== undefined && offHeader !== null && offHeader !== '') this.offset = Number(offHeader)
        if (method === 'HEAD' && status === 200) {
          const off = Number(offHeader)
          if (off > 0 && !this.resumed && this.resumedFrom) {
            this.resumed = true
            this.li.dataset.resumed = 'true'
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
          delete this.li.dataset.resumed
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
              this.fail('corsBlocked', `${words('corsBlocked')} Open this page at the address its operator gave you, or ask them to allow ${location.origin} (serve's --cors-origin ${location.origin}). Nothing was sent; Retry tries again.`)
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
        fetch(origin + '/', { mode: 'no-cors', cache: 'no-store', credentials: 'omit', referrerPolicy: 'no-referrer' })
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
        delete this.li.dataset.uploadId
        api('/market/vm-images/ticket/cancel', { upload_id: id }).then(() => refresh(), () => {})
      }

      // forget drops this file's session address from the URL storage
      // once the edge gave its verdict: it can never be resumed.
      forget () {
        const up = this.upload
        const s = window.tus.defaultOptions.urlStorage
        if (!up || !up.url || !s) return
        up.findPreviousUploads().then((prev) => Promise.all(prev.filter((p) => p.uploadUrl === up.url)
          .map((p) => s.removeUpload(p.urlStorageKey)))).catch(() => {})
      }

      fail (reason, text) {
        this.active = false
        this.set('refused', text, reason)
        pump()
        refresh()
      }

      success () {
        this.active = false
        this.bar.value = 100
        this.percent.textContent = '100 %'
        this.set('done', 'checked and stored')
        live(`${this.file.name}: 100 %, stored`)
        pump()
        refresh().then(() => this.showStored())
      }

      showStored () {
        const img = ((state.status && state.status.images) || []).find((i) => i.upload_id === this.uploadId)
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
        pump()
        refresh()
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
        rows.delete(this.key)
        this.li.remove()
        live(`${this.file.name}: dismissed`)
        const focus = next && next.querySelector('button:not([hidden])')
        if (focus) focus.focus()
        else if (!$('#upload-file').disabled) $('#upload-file').focus()
        else $('#main').focus()
        refresh()
      }

      retry () {
        this.proxyLimit = 0
        this.reach = ''
        this.queued = true
        this.set('waiting', 'waiting for a free transfer slot')
        pump()
      }
    }

    function parseBody (res) {
      if (!res) return {}
      try {
        const b = JSON.parse(res.getBody() || '')
        return b && typeof b === 'object' ? b : {}
      } catch (e) {
        return {}
      }
    }

    function add (files, efi) {
      const list = $('#upload-list')
      for (const f of files) {
        const dup = [...rows.values()].find((t) => t.file.name === f.name && t.file.size === f.size &&
          t.file.lastModified === f.lastModified && !['done', 'refused', 'cancelled'].includes(t.state))
        if (dup) {
          live(`${f.name} is already in the list`)
          continue
        }
        // A row from an earlier session for the same file gives way.
        for (const li of list.querySelectorAll('li.upload[data-session=true]')) {
          if (li.dataset.file === f.name) li.remove()
        }
        const t = new Transfer(f, efi)
        rows.set(t.key, t)
        list.prepend(t.li)
        t.check()
      }
    }

    // renderSessions lists the edge's unfinished uploads that no row of
    // this page is working on, so a user sees them after a reload and
    // knows how to go on.
    async function renderSessions (sessions) {
      const list = $('#upload-list')
      const mine = [...rows.values()].filter((t) => t.state !== 'cancelled')
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
    function busyIds () {
      return new Set([...rows.values()].filter((t) => t.uploadId && t.state !== 'cancelled').map((t) => t.uploadId))
    }

    return { add, renderSessions, busyIds }
  })()

  // ---- wiring ----

  function init () {
    if (!window.tus || !window.tus.isSupported || !window.vmshelfQcow2 || !window.vmshelfFormat) {
      setMessage('This browser cannot run the uploads of this page (tus-js-client, the QCOW2 check or the formats did not load).')
    }
    $('#token-form').addEventListener('submit', (ev) => {
      ev.preventDefault()
      const t = $('#token').value.trim()
      if (!t) return
      try {
        token.set(t)
      } catch (e) {
        setMessage('This browser does not let the page keep the token (session storage is off).')
        return
      }
      $('#token').value = ''
      state.rendered = false
      document.body.dataset.ready = 'false'
      refresh().then(() => { if (state.rendered) $('#main').focus() })
    })
    $('#token-forget').addEventListener('click', () => {
      token.forget()
      state.status = null
      state.rendered = false
      document.body.dataset.ready = 'false'
      setMessage('The token is forgotten in this tab.', 'info')
      showTokenForm(true)
      $('#token').focus()
    })
    $('#refresh').addEventListener('click', () => refresh())
    window.addEventListener('focus', () => refresh())
    document.addEventListener('visibilitychange', () => { if (document.visibilityState === 'visible') refresh() })

    $('#upload-form').addEventListener('submit', (ev) => {
      ev.preventDefault()
      const input = $('#upload-file')
      const files = [...(input.files || [])]
      if (!files.length) {
        setMessage('Choose one or more QCOW2 files first.')
        input.focus()
        return
      }
      setMessage('')
      uploads.add(files, $('#upload-efi').checked)
      input.value = ''
    })
    $('#image-list').addEventListener('click', (ev) => {
      const b = ev.target.closest('button.image-remove')
      if (b) removeImage(b)
    })
    $('#ticket-list').addEventListener('click', (ev) => {
      const b = ev.target.closest('button.ticket-cancel')
      if (b) cancelTicket(b)
    })
    $('#listing-list').addEventListener('click', (ev) => {
      const b = ev.target.closest('button.listing-close')
      if (b) closeListing(b)
    })
    $('#listing-form').addEventListener('submit', createListing)
    $('#listing-price').addEventListener('input', listingFee)
    $('#machine-list').addEventListener('click', (ev) => {
      const b = ev.target.closest('button.order-cancel')
      if (b) cancelOrder(b)
    })
    $('#onboarding-start').addEventListener('click', () => startOnboarding())
    $('#order-form').addEventListener('submit', placeOrder)
    for (const id of ['#order-listing', '#order-image', '#order-quantity']) {
      $(id).addEventListener('change', orderChosen)
      $(id).addEventListener('input', orderChosen)
    }

    // Back from Stripe Checkout: say how it went, and drop the query.
    const q = new URLSearchParams(location.search)
    if (q.get('checkout')) {
      const id = q.get('order') || ''
      setMessage(q.get('checkout') === 'success'
        ? `Thank you: order ${id} is paid once Stripe confirms it; its machines then start.`
        : `The checkout of order ${id} was left unpaid: pay it or cancel it under “Your machines” (unpaid, it is released when its checkout expires).`, 'info')
      history.replaceState(null, '', location.pathname)
    }
    // Back from Stripe's onboarding ("return": finished or not, only
    // Stripe's account.updated says), or its link had expired or was used
    // ("refresh": Stripe wants a new one, so the page asks for it).
    const onboarding = q.get('onboarding')
    if (onboarding === 'return' || onboarding === 'refresh') {
      state.onboarding = onboarding
      history.replaceState(null, '', location.pathname)
    }

    if (token.get()) {
      showTokenForm(false)
      show($('#app'), false)
      refresh().then(() => {
        if (state.onboarding !== 'refresh' || !state.rendered) return
        state.onboarding = ''
        startOnboarding()
      })
    } else {
      showTokenForm(true)
    }
  }

  if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init)
  else init()
})()

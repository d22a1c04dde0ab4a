// status.js: the page's state and its rendering from the edge's status
// (/market/vms/status): asked for after a token is given, after every
// action, on focus and, while something only the edge moves on is on its
// way, every 15 s.

import { api, token } from './api.js'
import { refusal, words } from './reasons.js'
import { $, show, setMessage } from './dom.js'
import { GiB } from './format.js'
import { renderImages, renderCatalogue } from './images.js'
import { renderOffers, renderOrderForm, renderMachines } from './orders.js'
import { renderListings } from './listings.js'
import * as uploads from './uploads.js'

// Used when status has no limits (an older edge): serve's own defaults.
const DEFAULT_LIMITS = { images_per_tenant: 3, upload_max_bytes: 32 * GiB, max_virtual_bytes: 512 * GiB, max_transfers: 4 }
const POLL_MS = 15000

export const state = {
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

export function refresh () {
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

export function schedulePoll (on) {
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

export function render () {
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

export function showTokenForm (on) {
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

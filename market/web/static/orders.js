// orders.js: the market as a buyer sees it: the offers, the order form
// and its checkout, and the box's machines (its orders and their
// replicas, with their consoles).

import { api } from './api.js'
import { REASONS, refusal, words } from './reasons.js'
import { $, el, show, count, setMessage } from './dom.js'
import { bytes, when, MiB, GiB } from './format.js'
import { money } from './money.js'
import { state, refresh } from './status.js'
import * as consolePanel from './console.js'
import { bootProblem } from './images.js'
import { replicaPowerButtons, orderPowerButtons } from './power.js'


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

// checkoutURL is the checkout address url if the page may send the
// buyer there: an https URL, or http on a loopback host (a development
// edge's fake Stripe). Anything else (javascript:, data:, plain http to
// another host, no URL at all) is null: the address comes from the
// edge, which relays Stripe's answer, and an href is no place to trust
// it blindly.
export function checkoutURL (url) {
  let u
  try { u = new URL(url) } catch (e) { return null }
  if (u.username || u.password) return null
  if (u.protocol === 'https:' && u.hostname) return u.href
  if (u.protocol === 'http:' && LOOPBACK.test(u.hostname)) return u.href
  return null
}
const LOOPBACK = /^(localhost|127\.\d{1,3}\.\d{1,3}\.\d{1,3}|\[::1\])$/

// sizeWords is one replica's size in words ({vcpu, memory_mib,
// disk_gib}, as offers carry it); '' when the edge sent none.
export function sizeWords (z) {
  if (!z || !z.vcpu) return ''
  return `${z.vcpu} vCPU${z.vcpu === 1 ? '' : 's'}, ${bytes(z.memory_mib * MiB)} memory, ${bytes(z.disk_gib * GiB)} disk`
}

export function renderOffers (st) {
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

export function renderOrderForm (st) {
  const c = (state.catalogue && state.catalogue.catalogue) || []
  const own = st.images || []
  const groups = []
  if (c.length) {
    groups.push(el('optgroup', { label: 'Systems' }, ...c.map((e) => el('option', { value: e.id, text: e.name }))))
  }
  if (own.length) {
    groups.push(el('optgroup', { label: 'Your images' }, ...own.map((i) =>
      el('option', { value: i.upload_id, 'data-efi': i.efi, text: `${i.name} (${bootProblem(i) ? 'cannot start a machine' : i.efi ? 'starts with UEFI' : 'starts with BIOS'})` }))))
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
  const img = ownImage(id)
  if (img) disk = Math.max(disk, Math.ceil(img.virtual_size / GiB))
  return sizeWords({ vcpu: offer.vcpu, memory_mib: mem, disk_gib: disk })
}

// orderChosen follows the order form's choices: the replicas the chosen
// offer has free bound the quantity, and #order-summary says before
// paying what the order buys: each replica's size and the total, the
// quantity times the price per replica-month.
export function orderChosen () {
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

export function renderMachines (st, market) {
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
          ...consoleButtons(o, r, i), ...replicaPowerButtons(o, r, i, refresh)))) : null,
      orderPowerButtons(o, refresh))
  }))
  show($('#machine-empty'), orders.length === 0)
}

// consoleButtons open the screen or the serial line of a running
// replica of an active order (the only ones the edge opens a console
// for); the console itself is console.js's.
function consoleButtons (o, r, i) {
  if (o.state !== 'active' || r.state !== 'running') return []
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
  consolePanel.open({
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

// cancelOrder cancels an order awaiting payment: its replicas go back to
// the offer at once and its checkout can be paid no more (one paid in
// the moment before is refunded by the edge).
export async function cancelOrder (btn) {
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

const DNS_LABEL = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/

// isInstaller: the image is a catalogue installation ISO, which takes
// no cloud-init.
function isInstaller (id) {
  return ((state.catalogue && state.catalogue.catalogue) || []).some((e) => e.id === id && e.source === 'iso')
}

// ownImage is the box's own image of that upload_id, if the order names one.
function ownImage (id) {
  return ((state.status && state.status.images) || []).find((i) => i.upload_id === id)
}

export async function placeOrder (ev) {
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
  else if (ownImage(req.image) && bootProblem(ownImage(req.image))) problem = bootProblem(ownImage(req.image))
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

// listings.js: the market as a host sees it: its listings, the form to
// list machines, and its payout account with Stripe.

import { api } from './api.js'
import { refusal, words } from './reasons.js'
import { $, el, show } from './dom.js'
import { when } from './format.js'
import { fractionDigits, money } from './money.js'
import { state, refresh } from './status.js'
import { checkoutURL } from './orders.js'

export function currencyOf (st) {
  const l = (st.listings || [])[0] || (st.offers || [])[0]
  return (l && l.currency) || st.currency || 'eur'
}

export function renderListings (st, market) {
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
export async function startOnboarding () {
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

export async function closeListing (btn) {
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
export function listingFee () {
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

export async function createListing (ev) {
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

// app.js: the Machines page, its entry point: it wires the page's forms
// and buttons to the modules that do the work. No build step: every file
// is an ES module the browser loads as it is, importing the others by
// name (index.html loads this one, and tus-js-client, the vendored classic
// script the uploads use as window.tus, before it):
//
//   api.js       the control plane's API, with the tenant token
//   reasons.js   every reason code in words
//   status.js    the page's state, the status it asks for and renders
//   images.js    images, quota, unused tickets, the catalogue's systems
//   orders.js    offers, the order form, the box's machines
//   listings.js  a host's listings and payouts
//   uploads.js   the upload rows; transfer.js, their rules without a DOM
//   console.js   a machine's console; format.js, money.js, qcow2.js, dom.js
//
// Every state the tests look at is a data-* attribute (see the DOM
// contract in the package's README); every refusal is shown in words.

import { token } from './api.js'
import { $, show, setMessage } from './dom.js'
import { state, refresh, showTokenForm } from './status.js'
import { removeImage, cancelTicket } from './images.js'
import { cancelOrder, orderChosen, placeOrder } from './orders.js'
import { closeListing, createListing, listingFee, startOnboarding } from './listings.js'
import * as uploads from './uploads.js'

function init () {
  if (!window.tus || !window.tus.isSupported) {
    setMessage('This browser cannot run the uploads of this page (tus-js-client, the QCOW2 check or the formats did not load).')
  }
  // The button is off in the HTML until this handler is on: a press
  // before it would submit the form itself, the token in its URL (which
  // the CSP's form-action 'none' blocks, so the press would do nothing).
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
  $('#token-save').disabled = false
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
  // For tests and tools: every handler of the page is on.
  document.body.dataset.wired = 'true'
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init)
else init()

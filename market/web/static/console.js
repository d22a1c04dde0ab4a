// console.js: a machine's console in the Machines page, its screen with
// noVNC (third_party/novnc/, 1.7.0) and its serial line with xterm.js (third_party/xterm/, 6.0.0),
// both vendored unchanged. An ES module; orders.js asks for a console
// through its open, with a function that fetches a ticket, so that the
// tenant token stays with api.js and never goes in a URL: the ticket's WebSocket URL is a capability for one
// console, usable once, within a minute.
//
// One console is open at a time, in the #console panel. Every state the
// tests look at is a data-* attribute of #console: data-kind ("vnc" or
// "serial"), data-state ("connecting", "open" or "closed") and, once
// closed, data-code (the WebSocket close code, or the refusal's reason
// when no WebSocket was opened). #console-status says the same in words.

import RFB from './third_party/novnc/core/rfb.js'
import { Terminal } from './third_party/xterm/xterm.mjs'

// What each close code of the edge means (market/console.go), in words
// the box owner can act on. The edge's own reason is shown only for a code
// not listed here.
const CLOSE_WORDS = {
  1000: 'The machine\'s console closed. Reconnect to open it again.',
  4404: 'This console\'s address expired or was used already. Reconnect to open it again.',
  4408: 'The console closed because nothing was typed or shown for a long time. Reconnect to open it again.',
  4409: 'The machine is not running; its console opens once it runs.',
  4410: 'The machine stopped running or its order ended, so its console closed.',
  4429: 'Too many consoles are open; close one and try again.',
  4502: 'The cluster did not open the machine\'s console. Reconnect to try again.',
  4503: 'The edge could not reach its records just now, so the console did not open. Try again in a few seconds.',
  4504: 'The console stopped taking what was typed or shown, so it closed. Reconnect to open it again.'
}
const LOST = 'The connection to the edge was lost. Reconnect to open the console again.'

const KIND_NAMES = { vnc: 'Screen', serial: 'Serial console' }

// xterm.js 6 writes its theme and the size of its rows into <style>
// elements it makes itself (xtermjs/xterm.js#4445). The page's CSP refuses
// every inline style, so those rules would be dropped, the terminal drawn
// wrong, and a violation reported for each. Rules that script builds
// through the CSSOM are no markup an injected string could forge, and the
// CSP lets them be: so a <style> element asked for while this module runs
// is an inert stand-in whose text becomes a constructed style sheet. The
// page itself makes no <style> elements (nothing else is affected).
function constructStyles () {
  const create = Document.prototype.createElement
  document.createElement = function (tag, options) {
    if (String(tag).toLowerCase() !== 'style') return create.call(this, tag, options)
    const stand = create.call(this, 'vmshelf-style', options)
    stand.hidden = true
    const sheet = new CSSStyleSheet()
    let text = ''
    Object.defineProperty(stand, 'textContent', {
      get: () => text,
      set: (v) => { text = String(v ?? ''); sheet.replaceSync(text) }
    })
    document.adoptedStyleSheets = [...document.adoptedStyleSheets, sheet]
    const remove = stand.remove.bind(stand)
    stand.remove = () => {
      document.adoptedStyleSheets = document.adoptedStyleSheets.filter((s) => s !== sheet)
      remove()
    }
    return stand
  }
}
constructStyles()

const $ = (sel) => document.querySelector(sel)

// The console now shown: null, or {kind, title, ticket, gen, ws, rfb, term}.
// gen counts connections, so that the events of one that was replaced
// (Reconnect) or closed by the user change nothing.
let cur = null
let gen = 0

function panel () { return $('#console') }

function say (state, words, code) {
  const p = panel()
  p.dataset.state = state
  if (code === undefined) delete p.dataset.code
  else p.dataset.code = String(code)
  $('#console-status').textContent = words
  $('#console-reconnect').hidden = state !== 'closed'
  $('#console-cad').disabled = state !== 'open'
}

// open shows the console of one replica: kind "vnc" or "serial", title
// what it is called in the page, ticket an async function answering the
// WebSocket URL of a fresh ticket or throwing an Error whose message is
// the refusal in words.
export function open ({ kind, title, ticket }) {
  close()
  const p = panel()
  p.dataset.kind = kind
  $('#console-heading').textContent = `${KIND_NAMES[kind] || kind}: ${title}`
  $('#console-cad').hidden = kind !== 'vnc'
  $('#console-screen').hidden = kind !== 'vnc'
  $('#console-serial').hidden = kind !== 'serial'
  p.hidden = false
  cur = { kind, title, ticket }
  if (kind === 'serial') {
    cur.term = new Terminal({
      cols: 80,
      rows: 25,
      fontFamily: 'ui-monospace, "DejaVu Sans Mono", monospace',
      fontSize: 15,
      scrollback: 1000,
      cursorBlink: true
    })
    cur.term.open($('#console-serial'))
    cur.term.onData((d) => send(d))
  }
  p.scrollIntoView({ block: 'start' })
  connect()
}

const encoder = new TextEncoder()

function send (text) {
  if (cur && cur.ws && cur.ws.readyState === WebSocket.OPEN) cur.ws.send(encoder.encode(text))
}

async function connect () {
  const c = cur
  if (!c) return
  const mine = ++gen
  drop(c)
  say('connecting', 'Opening the console…')
  let url
  try {
    url = await c.ticket()
  } catch (e) {
    if (mine === gen) say('closed', e.message, e.reason || 'refused')
    return
  }
  if (mine !== gen) return
  const ws = new WebSocket(url)
  ws.binaryType = 'arraybuffer'
  c.ws = ws
  ws.addEventListener('close', (e) => {
    if (mine !== gen) return
    say('closed', CLOSE_WORDS[e.code] || (e.reason ? e.reason.charAt(0).toUpperCase() + e.reason.slice(1) + '.' : LOST), e.code)
  })
  if (c.kind === 'vnc') {
    // noVNC takes the WebSocket as it is (connecting): the close code
    // above is ours to read, which noVNC's own events do not pass on.
    const rfb = new RFB($('#console-screen'), ws, {})
    rfb.scaleViewport = true
    rfb.background = '#000'
    rfb.addEventListener('connect', () => {
      if (mine === gen) say('open', 'Connected. Keys typed here go to the machine; click the screen first.')
      rfb.focus()
    })
    c.rfb = rfb
  } else {
    ws.addEventListener('open', () => {
      if (mine !== gen) return
      say('open', 'Connected. Keys typed here go to the machine\'s serial line; press Enter if it shows nothing.')
      c.term.focus()
    })
    ws.addEventListener('message', (e) => {
      if (mine === gen) c.term.write(new Uint8Array(e.data))
    })
  }
}

// drop ends c's connection, if any, without a word: the user closed the
// console or asked for a new connection.
function drop (c) {
  if (c.rfb) {
    try { c.rfb.disconnect() } catch (e) {}
    c.rfb = null
  }
  if (c.ws) {
    try { c.ws.close(1000) } catch (e) {}
    c.ws = null
  }
}

export function close () {
  gen++
  if (cur) {
    drop(cur)
    if (cur.term) cur.term.dispose()
  }
  cur = null
  if (document.fullscreenElement === panel()) document.exitFullscreen().catch(() => {})
  $('#console-screen').replaceChildren()
  $('#console-serial').replaceChildren()
  panel().hidden = true
  delete panel().dataset.state
  delete panel().dataset.code
}

function fullScreen () {
  const p = panel()
  if (document.fullscreenElement === p) {
    document.exitFullscreen().catch(() => {})
    return
  }
  p.requestFullscreen().catch(() => {
    $('#console-status').textContent = 'This browser did not allow full screen here.'
  })
}

function init () {
  $('#console-close').addEventListener('click', close)
  $('#console-reconnect').addEventListener('click', connect)
  $('#console-full').addEventListener('click', fullScreen)
  $('#console-cad').addEventListener('click', () => {
    if (cur && cur.rfb) {
      cur.rfb.sendCtrlAltDel()
      cur.rfb.focus()
    }
  })
  document.addEventListener('fullscreenchange', () => {
    const on = document.fullscreenElement === panel()
    panel().dataset.full = String(on)
    $('#console-full').textContent = on ? 'Leave full screen' : 'Full screen'
    if (cur && cur.term) cur.term.focus()
  })
}

init()

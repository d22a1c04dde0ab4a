// power.js: the machines of an active order stopped, started and
// restarted by their buyer (/market/vms/orders/power), one replica or all.
// Each press sends a request id of its own, and a press that got no
// answer is asked again with the same id: the edge then gives the first
// answer instead of acting twice (a restart happens once).

import { api } from './api.js'
import { el, setMessage } from './dom.js'
import { refusal, words } from './reasons.js'

const PAST = { start: 'started', stop: 'stopped', restart: 'restarted' }
const TRIES = 4

// replicaPowerButtons are a replica's buttons: Stop and Restart while it
// runs or starts, Start once stopped (or failed); none while its disk is
// imported or when the order is not active.
export function replicaPowerButtons (o, r, i, refresh) {
  if (o.state !== 'active' || r.state === 'importing') return []
  const actions = r.state === 'stopped' || r.state === 'failed' ? ['start'] : ['stop', 'restart']
  return [el('span', { class: 'replica-power' },
    ...actions.map((a) => button(a, `${label(a)} ${r.name}`, () => power(o, i, a, r.name, refresh), 'replica-' + a)))]
}

// orderPowerButtons are an order's Stop all and Start all, for an active
// order of which more than one replica could take them (none importing).
export function orderPowerButtons (o, refresh) {
  if (o.state !== 'active' || (o.replicas || []).filter((r) => r.state !== 'importing').length < 2) return null
  const what = `every machine of ${o.name}`
  return el('div', { class: 'actions order-power' },
    button('stop', `Stop ${what}`, () => power(o, undefined, 'stop', what, refresh), 'order-stop', 'Stop all'),
    button('start', `Start ${what}`, () => power(o, undefined, 'start', what, refresh), 'order-start', 'Start all'))
}

function label (action) {
  return action.charAt(0).toUpperCase() + action.slice(1)
}

function button (action, aria, onClick, cls, text) {
  const b = el('button', { type: 'button', class: cls, 'data-action': action, 'aria-label': aria, text: text || label(action) })
  b.addEventListener('click', async () => {
    b.disabled = true
    try { await onClick() } finally { b.disabled = false }
  })
  return b
}

// power asks the edge, with retries of the same request id while no
// answer, or a passing one, comes; then refreshes and says what became of
// each machine.
async function power (o, replica, action, what, refresh) {
  const body = { order_id: o.order_id, action, request_id: requestID() }
  if (replica !== undefined) body.replica = replica
  let ans
  for (let attempt = 1; attempt <= TRIES; attempt++) {
    ans = await api('/market/vms/orders/power', body)
    const passing = ans.status === 0 || ans.status >= 500 || ans.reason === 'powerInProgress'
    if (ans.ok || !passing || attempt === TRIES) break
    await new Promise((resolve) => setTimeout(resolve, Math.max(500 * 2 ** (attempt - 1), 1000 * (ans.retryAfter || 0))))
  }
  // After the refresh, whose answer clears the message.
  await refresh()
  if (!ans.ok) {
    setMessage(`${label(action)} of ${what} was not done: ${refusal(ans)}`)
    return
  }
  const replicas = (ans.data && ans.data.replicas) || []
  const done = replicas.filter((x) => x.outcome === 'accepted').map((x) => x.name)
  const refused = replicas.filter((x) => x.outcome !== 'accepted').map((x) => `${x.name}: ${words(x.outcome, x.error)}`)
  setMessage([done.length ? `${label(PAST[action])}: ${done.join(', ')}. It takes a moment to show.` : '',
    refused.length ? `Not ${PAST[action]}: ${refused.join(' ')}` : ''].filter(Boolean).join(' '), refused.length ? 'error' : 'info')
}

// requestID is 128 random bits in hex.
function requestID () {
  const b = new Uint8Array(16)
  crypto.getRandomValues(b)
  return Array.from(b, (x) => x.toString(16).padStart(2, '0')).join('')
}

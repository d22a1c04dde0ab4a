// api.js: the control plane's API as the page calls it, with the tenant
// token.
//
// The tenant token lives in sessionStorage["vmshelf.token"] only: it is
// sent to this origin's API in an Authorization header and never put in a
// URL.

const TOKEN_KEY = 'vmshelf.token'

export const token = {
  get () { try { return sessionStorage.getItem(TOKEN_KEY) || '' } catch (e) { return '' } },
  set (t) { sessionStorage.setItem(TOKEN_KEY, t) },
  forget () { try { sessionStorage.removeItem(TOKEN_KEY) } catch (e) {} }
}

// api POSTs body as JSON to the control plane with the token and
// answers {ok, status, data, reason, error, retryAfter}; a request that
// got no answer is {ok: false, status: 0, reason: 'network'}.
export async function api (path, body, method) {
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

// dom.js: the small DOM helpers of the page's modules: text only, never
// HTML from data.

export const $ = (sel) => document.querySelector(sel)
export function el (tag, attrs, ...children) {
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
export function show (e, on) { e.hidden = !on }

export function count (n, one, many) {
  return `${n} ${n === 1 ? one : many}`
}

export function setMessage (text, kind) {
  const m = $('#message')
  m.textContent = text || ''
  m.dataset.kind = kind || 'error'
  show(m, !!text)
}

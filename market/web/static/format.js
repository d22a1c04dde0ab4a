// format.js: how the Machines page writes sizes and times, in one place,
// the way the CLI writes them (`vmshelf images`): sizes with binary
// prefixes as go-humanize's IBytes does ("512 B", "1.5 GiB", "20 GiB"),
// times in UTC, said so ("2026-12-02 10:40 UTC"), never in the browser's
// zone or locale, which the CLI's reader and the page's may not share.
//
// An ES module, imported by the page's modules and, under node, by
// market/web's tests, which hold it to the Go side's formats.

export const MiB = 1024 * 1024
export const GiB = 1024 * MiB

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB']

// bytes is n bytes as humanize.IBytes writes it: under 10 the bare
// count, else the largest unit the size reaches, rounded to a tenth,
// with one decimal below 10 and none from 10 on.
export function bytes (n) {
  if (!Number.isFinite(n) || n < 0) return '?'
  if (n < 10) return `${Math.round(n)} B`
  const e = Math.min(Math.floor(Math.log(n) / Math.log(1024)), UNITS.length - 1)
  const v = Math.floor((n / 1024 ** e) * 10 + 0.5) / 10
  return `${v < 10 ? v.toFixed(1) : v.toFixed(0)} ${UNITS[e]}`
}

const pad = (n) => String(n).padStart(2, '0')

// when is an instant (an RFC 3339 string from the edge, or a Date) as
// "YYYY-MM-DD HH:MM UTC"; what is no time comes back as it was.
export function when (t) {
  if (!t) return ''
  const d = t instanceof Date ? t : new Date(t)
  if (Number.isNaN(d.getTime())) return String(t)
  return `${d.getUTCFullYear()}-${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())} ` +
    `${pad(d.getUTCHours())}:${pad(d.getUTCMinutes())} UTC`
}

// duration is s seconds in words, for how long an upload has left.
export function duration (s) {
  if (!Number.isFinite(s) || s < 0) return ''
  if (s < 60) return `${Math.max(1, Math.round(s))} s`
  if (s < 3600) return `${Math.round(s / 60)} min`
  return `${Math.floor(s / 3600)} h ${Math.round((s % 3600) / 60)} min`
}

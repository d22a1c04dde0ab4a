// images.js: the box's images, its quota, its unused tickets and the
// catalogue's systems, and the actions on them.

import { api } from './api.js'
import { refusal, REASONS } from './reasons.js'
import { $, el, show, count, setMessage } from './dom.js'
import { bytes, when, MiB, GiB } from './format.js'
import { state, refresh } from './status.js'
import { busyIds } from './uploads.js'

// renderImages shows the images, the quota and what counts against it
// (the edge counts stored images, unfinished uploads and unused tickets
// alike), and at the quota closes the file input with what to do, so no
// file is chosen only to be refused.
export function renderImages (st) {
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
    bootProblem(img) && el('p', { class: 'notice image-boot', text: bootProblem(img) }),
    el('div', { class: 'actions' },
      el('button', { type: 'button', class: 'image-remove', 'aria-label': `Remove image ${img.name}`, text: 'Remove', 'data-upload-id': img.upload_id })))))
  show($('#image-empty'), images.length === 0)
  renderTickets(tickets)
  const sharing = !st.account || st.account.sharing !== false
  show($('#upload-form'), sharing)
  atQuota(used >= limit, { images: images.length, sessions: sessions.length, tickets: tickets.length, limit })
}

// bootProblem says, for an image whose first sectors the edge read at
// its upload, why no machine can start from it as uploaded; null where
// one can (or where the image is older than that reading: no boot).
export function bootProblem (img) {
  const boot = img.boot || ''
  if (!boot) return null
  if (boot === 'none') return REASONS.noBootLoader
  const want = img.efi ? 'uefi' : 'bios'
  if (boot.split('+').includes(want)) return null
  return img.efi
    ? 'This disk starts only with a BIOS, but it was uploaded with the EFI box ticked: a machine made from it would stop in the UEFI shell. Upload it again without the box.'
    : 'This disk starts only with UEFI, but it was uploaded without the EFI box: a machine made from it would find no bootable device. Upload it again with the box ticked.'
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
  const busy = busyIds()
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

export function renderCatalogue () {
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

// ---- actions ----

// removeImage asks first: a removed image is gone from the edge (its
// file deleted, its fetch tokens revoked) and cannot be undone. The first
// press turns the button into "Remove for good" beside a "Keep" button;
// only the second press sends the request.
export async function removeImage (btn) {
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
export async function cancelTicket (btn) {
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

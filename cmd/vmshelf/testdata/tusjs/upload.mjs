// Uploads FILE to a vmshelf upload URL with tus-js-client, the tus
// reference client: node upload.mjs ENDPOINT FILE
// ENDPOINT is the upload_url of a ticket. Prints "done offset=N length=M"
// (the session's HEAD after the last byte) and exits 0, or prints the error
// and exits 1. Capabilities (64 hex) are masked in everything printed.
import fs from 'node:fs'
import path from 'node:path'
import tus from 'tus-js-client'

const mask = (s) => String(s).replace(/[0-9a-fA-F]{64}/g, '…')

const [endpoint, file] = process.argv.slice(2)
if (!endpoint || !file) {
  console.error('usage: node upload.mjs ENDPOINT FILE')
  process.exit(2)
}

const data = fs.readFileSync(file)
const upload = new tus.Upload(data, {
  endpoint,
  retryDelays: [0, 250, 500, 1000, 2000, 4000, 8000],
  metadata: { filename: path.basename(file) },
  onShouldRetry(err, attempt) {
    const status = err.originalResponse ? err.originalResponse.getStatus() : 0
    console.error(`retry ${attempt + 1} after: ${status || 'no answer'}`)
    // tus-js-client's own rule: anything but a 4xx other than 409 and 423.
    return !(status >= 400 && status < 500 && status !== 409 && status !== 423)
  },
  onError(err) {
    const res = err.originalResponse
    const detail = res ? ` (${res.getStatus()} ${mask(res.getBody() ?? '')})` : ''
    console.error(`upload failed: ${mask(err.message)}${detail}`)
    process.exit(1)
  },
  async onSuccess() {
    try {
      const res = await fetch(upload.url, { method: 'HEAD', headers: { 'Tus-Resumable': '1.0.0' } })
      console.log(`done offset=${res.headers.get('upload-offset')} length=${res.headers.get('upload-length')}`)
    } catch (err) {
      console.log('done')
    }
  },
})
upload.start()

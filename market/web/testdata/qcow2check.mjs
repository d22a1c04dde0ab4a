// Runs the page's QCOW2 check (static/qcow2.js) on files, as the browser
// does (checkFile on a Blob), for qcow2_test.go:
//   node qcow2check.mjs QCOW2_JS MAX_VIRTUAL_BYTES UPLOAD_MAX_BYTES FILE...
// Prints one JSON object: {"<file>": {"ok":…, "reason":…, …}, …}.
import fs from 'node:fs'
import { pathToFileURL } from 'node:url'

const [script, maxVirtual, uploadMax, ...files] = process.argv.slice(2)
if (!script || !uploadMax) {
  console.error('usage: node qcow2check.mjs QCOW2_JS MAX_VIRTUAL_BYTES UPLOAD_MAX_BYTES FILE...')
  process.exit(2)
}
const { checkFile } = await import(pathToFileURL(script).href)
const limits = { maxVirtualBytes: Number(maxVirtual), uploadMaxBytes: Number(uploadMax) }
const out = {}
for (const f of files) {
  out[f] = await checkFile(await fs.openAsBlob(f), limits)
}
console.log(JSON.stringify(out))

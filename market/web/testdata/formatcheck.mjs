// Runs the page's formatters (static/format.js) on values, for
// format_test.go:
//   node formatcheck.mjs FORMAT_JS < {"bytes": [N…], "times": ["RFC 3339"…]}
// Prints one JSON object: {"bytes": ["…"…], "times": ["…"…]}.
import fs from 'node:fs'
import { pathToFileURL } from 'node:url'

const [script] = process.argv.slice(2)
if (!script) {
  console.error('usage: node formatcheck.mjs FORMAT_JS < values.json')
  process.exit(2)
}
const { bytes, when } = await import(pathToFileURL(script).href)
const input = JSON.parse(fs.readFileSync(0, 'utf8'))
console.log(JSON.stringify({ bytes: input.bytes.map(bytes), times: input.times.map(when) }))

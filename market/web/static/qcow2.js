// qcow2.js: the browser's check of a QCOW2 header before an upload takes a
// ticket, the same rules as the edge's own gate (qcow2,
// header.go and inspector.go) and `vmshelf check`, as far as the first
// cluster decides. The edge checks everything again as the bytes arrive;
// this only spares a user the wait (and a ticket) for a file the edge is
// sure to refuse.
//
// An ES module, imported by uploads.js and, under node, by market/web's
// tests, which hold it to the edge's gate.

const MAGIC = [0x51, 0x46, 0x49, 0xfb] // "QFI\xfb"
const V2_HEADER_LENGTH = 72
const V3_HEADER_LENGTH = 104
const MIN_CLUSTER_BITS = 9
const MAX_CLUSTER_BITS = 21
const MIN_EXT_L2_CLUSTER_BITS = 14
const MAX_REFCOUNT_ORDER = 6
const MAX_L1_BYTES = 32 << 20
const MAX_REFCOUNT_TABLE_BYTES = 8 << 20
const MAX_SNAPSHOTS = 65536

const INCOMPAT_DIRTY = 1n << 0n
const INCOMPAT_CORRUPT = 1n << 1n
const INCOMPAT_DATA_FILE = 1n << 2n
const INCOMPAT_COMPRESSION = 1n << 3n
const INCOMPAT_EXTENDED_L2 = 1n << 4n
const INCOMPAT_KNOWN = INCOMPAT_DIRTY | INCOMPAT_CORRUPT | INCOMPAT_DATA_FILE | INCOMPAT_COMPRESSION | INCOMPAT_EXTENDED_L2
const AUTOCLEAR_DATA_FILE_RAW = 1n << 1n

const EXT_END = 0x00000000
const EXT_BACKING_FORMAT = 0xe2792aca
const EXT_DATA_FILE = 0x44415441
const EXT_LUKS = 0x0537be77

// The first read: enough for the header and the usual extensions of a
// 64 KiB cluster. A larger cluster is read on if its extensions go on.
const FIRST_READ = 64 << 10

function refuse (reason, message) {
  return { ok: false, reason, message }
}

// checkHeader decides on b, the first b.length bytes of a file of
// fileSize bytes, under limits {maxVirtualBytes, uploadMaxBytes}. It
// answers {ok: true, version, virtualSize, clusterSize}, a refusal
// {ok: false, reason, message} with the edge's reason code, or
// {need: n} when it must see the first n bytes to decide.
export function checkHeader (b, fileSize, limits) {
  const maxVirtual = BigInt(Math.floor(limits.maxVirtualBytes))
  if (fileSize > limits.uploadMaxBytes) {
    return refuse('tooLarge', `the file is ${fileSize} bytes, more than the ${limits.uploadMaxBytes} bytes this edge accepts`)
  }
  const end = b.length >= fileSize // b is the whole file
  const dv = new DataView(b.buffer, b.byteOffset, b.byteLength)
  const need = (n) => {
    if (b.length >= n) return null
    if (!end) return { need: n }
    if (b.length < 8) return refuse('notQcow2', `not a QCOW2 image: only ${b.length} bytes`)
    return refuse('badHeader', `the file ends at byte ${b.length}, inside the QCOW2 header`)
  }
  let r
  for (let i = 0; i < MAGIC.length && i < b.length; i++) {
    if (b[i] !== MAGIC[i]) return refuse('notQcow2', `not a QCOW2 image: bad magic at byte ${i}`)
  }
  if ((r = need(8))) return r
  const version = dv.getUint32(4)
  if (version !== 2 && version !== 3) {
    return refuse('notQcow2', `unsupported QCOW2 version ${version} (want 2 or 3)`)
  }
  if ((r = need(20))) return r
  if (dv.getBigUint64(8) !== 0n || dv.getUint32(16) !== 0) {
    return refuse('backingFile', 'the image has a backing file; upload a standalone image (qemu-img convert)')
  }
  if ((r = need(24))) return r
  const clusterBits = dv.getUint32(20)
  if (clusterBits < MIN_CLUSTER_BITS || clusterBits > MAX_CLUSTER_BITS) {
    return refuse('badHeader', `cluster_bits ${clusterBits} outside ${MIN_CLUSTER_BITS}..${MAX_CLUSTER_BITS}`)
  }
  const cs = 2 ** clusterBits
  const csBig = BigInt(cs)
  if ((r = need(32))) return r
  const virtualSize = dv.getBigUint64(24)
  if (virtualSize === 0n) return refuse('badHeader', 'the virtual size is 0')
  if (virtualSize > maxVirtual) {
    return Object.assign(refuse('virtualSizeTooLarge', `the virtual size of ${virtualSize} bytes exceeds this edge's limit of ${maxVirtual} bytes`),
      { virtualSize: Number(virtualSize) })
  }
  if ((r = need(36))) return r
  const crypt = dv.getUint32(32)
  if (crypt !== 0) return refuse('encrypted', `the image is encrypted (crypt_method ${crypt})`)
  if ((r = need(48))) return r
  const l1Size = dv.getUint32(36)
  if (dv.getBigUint64(40) % csBig !== 0n) return refuse('badHeader', 'the L1 table offset is not cluster-aligned')
  if ((r = need(60))) return r
  if (dv.getBigUint64(48) % csBig !== 0n) return refuse('badHeader', 'the refcount table offset is not cluster-aligned')
  const rt = dv.getUint32(56) * cs
  if (rt === 0 || rt > MAX_REFCOUNT_TABLE_BYTES) return refuse('badHeader', 'the refcount table size is out of bounds')
  if ((r = need(72))) return r
  if (dv.getUint32(60) > MAX_SNAPSHOTS) return refuse('badHeader', `more than ${MAX_SNAPSHOTS} snapshots`)
  if (dv.getBigUint64(64) % csBig !== 0n) return refuse('badHeader', 'the snapshot table offset is not cluster-aligned')

  let incompat = 0n
  let headerLength = V2_HEADER_LENGTH
  if (version === 3) {
    if ((r = need(80))) return r
    incompat = dv.getBigUint64(72)
    if (incompat & INCOMPAT_DATA_FILE) return refuse('externalDataFile', 'the image keeps its data in an external file')
    if (incompat & INCOMPAT_CORRUPT) return refuse('corrupt', 'the image is marked corrupt')
    if (incompat & ~INCOMPAT_KNOWN) return refuse('badHeader', 'the image has incompatible features this edge does not know')
    if ((incompat & INCOMPAT_EXTENDED_L2) && clusterBits < MIN_EXT_L2_CLUSTER_BITS) {
      return refuse('badHeader', 'extended L2 entries need clusters of at least 16 KiB')
    }
  }
  const l1 = checkL1(virtualSize, clusterBits, l1Size, incompat)
  if (l1) return l1
  let compressionType = 0
  if (version === 3) {
    if ((r = need(96))) return r
    if (dv.getBigUint64(88) & AUTOCLEAR_DATA_FILE_RAW) return refuse('externalDataFile', 'the image declares a raw external data file')
    if ((r = need(V3_HEADER_LENGTH))) return r
    if (dv.getUint32(96) > MAX_REFCOUNT_ORDER) return refuse('badHeader', `refcount_order above ${MAX_REFCOUNT_ORDER}`)
    headerLength = dv.getUint32(100)
    if (headerLength < V3_HEADER_LENGTH || headerLength % 8 !== 0 || headerLength > cs) {
      return refuse('badHeader', `header_length ${headerLength} is not a multiple of 8 in ${V3_HEADER_LENGTH}..${cs}`)
    }
    if (headerLength > V3_HEADER_LENGTH) {
      if ((r = need(V3_HEADER_LENGTH + 1))) return r
      compressionType = b[V3_HEADER_LENGTH]
    }
    const bit = (incompat & INCOMPAT_COMPRESSION) !== 0n
    if (compressionType !== 0 && compressionType !== 1) return refuse('badHeader', `unknown compression type ${compressionType}`)
    if (compressionType === 0 && bit) return refuse('badHeader', 'the compression-type feature bit is set for zlib')
    if (compressionType !== 0 && !bit) return refuse('badHeader', 'a compression type without its feature bit')
  }

  // Header extensions, up to the end of the first cluster.
  let pos = headerLength
  for (;;) {
    if (pos === cs) break // the list filled the cluster exactly
    if (cs - pos < 8) return refuse('badHeader', 'header extensions run past the first cluster')
    if ((r = need(pos + 8))) return r
    const type = dv.getUint32(pos)
    const length = dv.getUint32(pos + 4)
    pos += 8
    if (type === EXT_END) break
    if (type === EXT_BACKING_FORMAT) return refuse('backingFile', 'the image has a backing file format extension')
    if (type === EXT_DATA_FILE) return refuse('externalDataFile', 'the image names an external data file')
    if (type === EXT_LUKS) return refuse('encrypted', 'the image has a LUKS encryption header')
    const padded = Math.ceil(length / 8) * 8
    if (padded > cs - pos) return refuse('badHeader', 'a header extension overruns the first cluster')
    pos += padded
    // The edge skips the extension's data as it streams: a file that
    // ends inside it ends inside the header.
    if (end && b.length < pos) return refuse('badHeader', `the file ends at byte ${b.length}, inside the QCOW2 header`)
  }
  return { ok: true, version, virtualSize: Number(virtualSize), clusterSize: cs }
}

// checkL1: the L1 table must cover the virtual size and stay within
// QEMU's bound.
function checkL1 (virtualSize, clusterBits, l1Size, incompat) {
  const cs = 1n << BigInt(clusterBits)
  const entry = (incompat & INCOMPAT_EXTENDED_L2) ? 16n : 8n
  const perL1 = cs * (cs / entry)
  const need = (virtualSize + perL1 - 1n) / perL1
  if (BigInt(l1Size) < need) return refuse('badHeader', `the L1 table of ${l1Size} entries is too small for the virtual size`)
  if (l1Size * 8 > MAX_L1_BYTES) return refuse('badHeader', 'the L1 table exceeds 32 MiB')
  return null
}

// checkFile reads as much of blob (a File) as the verdict needs, at most
// its first cluster, and answers checkHeader's verdict. A file that
// cannot be read answers {ok: false, reason: 'unreadable'}.
export async function checkFile (blob, limits) {
  let n = Math.min(FIRST_READ, blob.size)
  for (;;) {
    let bytes
    try {
      bytes = new Uint8Array(await blob.slice(0, n).arrayBuffer())
    } catch (err) {
      return refuse('unreadable', `the file cannot be read: ${err && err.message ? err.message : err}`)
    }
    const v = checkHeader(bytes, blob.size, limits)
    if (!v.need) return v
    n = Math.min(Math.max(v.need, 2 * n), blob.size)
  }
}

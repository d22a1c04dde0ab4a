// reasons.js: every reason code the edge answers, and the page's own, in
// words: a refusal is shown as a sentence, never as a bare code.
// market/web's TestEveryReasonHasWords reads REASONS and fails on a code
// the edge answers that has no sentence here.

// REASONS turns every reason code the edge answers (control plane,
// data plane, the QCOW2 gate) and the page's own into a sentence.
export const REASONS = {
  // tokens and tenants
  unauthorized: 'The token was not accepted. Paste the box\'s tenant token again.',
  notSharing: 'This box does not share its disk with the mesh, so it can neither upload images nor use the machine market. An operator turns sharing on with "vmshelf tenant set NAME --sharing".',
  // the machine market
  notOffered: 'This edge does not offer machines yet: its operator has not turned them on. You can still upload images here.',
  paymentsUnavailable: 'This edge cannot take payments right now (Stripe is not configured or did not answer). Try again later.',
  webhookNotConfigured: 'This edge cannot confirm payments: its Stripe webhook secret is not configured.',
  clusterUnreachable: 'The edge cannot reach its cluster right now; paid machines start once it can.',
  notHosting: 'Only a box in the mesh that shares its disk and hosts machines (with an appliance node) can list machines, and the host of that offer no longer does.',
  noPayoutAccount: 'This box has no Stripe account that can receive payouts, so it cannot list machines.',
  orderUnknown: 'You have no such order: only the buyer of a machine opens its console, starts, stops or restarts it, or cancels its order.',
  replicaUnknown: 'The order has no such machine.',
  replicaNotRunning: 'The machine is not running; its console opens once it runs.',
  consoleBusy: 'Too many consoles are open; close one and try again.',
  badOrigin: 'A machine\'s console opens only from this edge\'s own Machines page.',
  consoleUnavailable: 'This edge reaches no cluster, so it cannot open a machine\'s console.',
  alreadyRunning: 'The machine is running already (or still starting).',
  alreadyStopped: 'The machine is stopped already.',
  machineStopped: 'The machine is not running, so it cannot be restarted; start it instead.',
  replicaImporting: 'The machine\'s disk is still being copied to its host; the machine starts by itself when the copy is done.',
  machinesNotMade: 'The order\'s machines are still being made; try again once they show as starting or running.',
  orderEnded: 'The order\'s paid month is over (or its payment was given back): its machines stay stopped.',
  powerInProgress: 'The same action is still on its way; wait a few seconds.',
  powerUnavailable: 'This edge reaches no cluster, so it cannot start or stop machines.',
  clusterBusy: 'The cluster did not take the action; nothing changed. Try again in a minute.',
  payoutsNotEnabled: 'This box\'s Stripe account cannot receive payouts yet: finish setting up payouts with Stripe on the Machines page ("Set up payouts with Stripe" under "Your listings").',
  accountManagedElsewhere: 'This box\'s Stripe account was set by the edge\'s operator, not made here: its payouts are set up with Stripe directly, or by the operator.',
  badOnboardingURL: 'The edge answered a Stripe onboarding address that is not an https address, so the page does not open it. Tell the edge\'s operator.',
  listingUnknown: 'That offer no longer exists.',
  noCapacity: 'That offer does not have that many replicas free any more.',
  ownListing: 'A box cannot order machines from its own listing.',
  tooManyListings: 'This box already has the most open listings allowed; close one first.',
  tooManyUnpaidOrders: 'This box already has the most orders awaiting payment; pay, cancel or let one expire first.',
  orderNotAwaitingPayment: 'Only an order awaiting payment can be cancelled; this one is not (any more).',
  belowMinimumCharge: 'The price is below the smallest charge Stripe accepts in this currency.',
  paymentRefused: 'The payment provider refused to open the checkout; the order was cancelled.',
  badCheckoutURL: 'The edge answered a checkout address that is not an https address, so the page does not open it. Tell the edge\'s operator; the order expires unpaid.',
  checkoutFailed: 'The checkout could not be opened; the order was cancelled.',
  checkoutExpired: 'The checkout expired before it was paid.',
  buyerCancelled: 'You cancelled the order before paying; its replicas went back to the offer.',
  paymentFailed: 'The payment failed.',
  imageUnknown: 'That image does not exist (any more) on this box.',
  imageInUse: 'An order that is awaiting payment, paid or running uses this image; remove it once the order has ended.',
  needsConsole: 'This system installs from an ISO and needs the browser console, which this edge does not offer yet.',
  userDataNotForInstaller: 'An installation ISO runs its own installer; cloud-init user data cannot be given to it.',
  noBootLoader: 'This disk has no boot loader: no boot code in its first sector and no FAT file system for UEFI, so a machine made from it would stop at "No bootable device". Upload a disk with a system installed on it.',
  wrongFirmware: 'This disk starts only with the other firmware than its EFI box chose. Upload it again with the EFI box the other way.',
  // uploads: the control plane
  imageQuota: 'This box already holds as many images (counting unfinished uploads and unused tickets) as the edge allows. Remove an image, cancel an unused ticket or an unfinished upload, or let one expire.',
  noSpace: 'The edge\'s disk is full; uploads are refused until space is freed.',
  rateLimited: 'Too many requests in a short time; wait a little and try again.',
  // uploads: the image itself
  notQcow2: 'This file is not a QCOW2 image (version 2 or 3). Convert it with "qemu-img convert -O qcow2".',
  backingFile: 'This image depends on a backing file. Upload a standalone image: "qemu-img convert -O qcow2 in.qcow2 out.qcow2".',
  externalDataFile: 'This image keeps its data in an external file. Upload a standalone image made with "qemu-img convert".',
  encrypted: 'This image is encrypted; the edge cannot start machines from it. Upload an unencrypted image.',
  corrupt: 'This image is marked corrupt or its tables are inconsistent. Repair it with "qemu-img check -r all", or convert it.',
  badHeader: 'This image\'s QCOW2 header is damaged or uses features the edge does not accept.',
  virtualSizeTooLarge: 'The disk inside this image is larger than this edge accepts.',
  tooLarge: 'This file is larger than this edge accepts.',
  unreadable: 'The browser could not read this file.',
  // uploads: the transfer
  proxyTooLarge: 'A proxy in front of the edge refuses even the smallest upload chunks.',
  network: 'The edge could not be reached, even after several tries. Check the connection and press Retry: the upload goes on where it stopped.',
  corsBlocked: 'The browser blocked the upload: the edge answers, but does not let a page at this address send to it.',
  busy: 'The edge is running as many transfers as it may; retrying shortly.',
  shuttingDown: 'The edge is restarting; retrying shortly.',
  locked: 'Another request for this upload is still running; retrying shortly.',
  takenOver: 'Another request took this upload over.',
  offsetMismatch: 'The edge holds a different part of this upload than expected; asking it where to go on.',
  idle: 'The connection stalled.',
  incompleteBody: 'The connection ended before the part arrived.',
  clientGone: 'The connection ended.',
  sessionUnknown: 'The edge no longer knows this upload (it ended, was cancelled or expired after 24 hours).',
  ticketUnknown: 'The upload ticket is not known to the edge.',
  ticketUsed: 'The upload ticket was already used.',
  ticketExpired: 'The upload ticket expired before the upload started.',
  tusVersion: 'The edge speaks a different version of the upload protocol.',
  badContentType: 'The edge refused the upload request\'s content type.',
  // generic answers
  badRequest: 'The edge refused the request as malformed.',
  requestTimeout: 'The request took too long to arrive.',
  repeatedHeader: 'The edge refused the request: it gave a header twice that carries one value (a proxy between the browser and the edge may have added it).',
  ambiguousLength: 'The edge refused the request: its length was given two ways (a proxy between the browser and the edge may have changed it).',
  notFound: 'The edge does not know this address.',
  methodNotAllowed: 'The edge does not accept this request here.',
  unsupportedMediaType: 'The edge wants JSON for this request.',
  internal: 'The edge failed to answer (an internal error). Try again; if it persists, tell its operator.',
  storeCorrupt: 'The edge\'s record store is damaged.',
  storeUnwritable: 'The edge cannot write its records.',
  notReady: 'The edge is not ready.',
  blobStoreUnreachable: 'The edge cannot reach the storage that holds the images. Try again later.',
  storeUnreachable: 'The edge cannot reach its record store right now. Try again in a few seconds.',
  // answers the page never provokes, for completeness
  badSignature: 'The webhook\'s signature did not verify.',
  rangeNotSatisfiable: 'The requested range lies outside the image.',
  tokenUnknown: 'The fetch token is not known, was revoked or has expired.',
  cancelled: 'Cancelled.'
}

export function words (reason, fallback) {
  return REASONS[reason] || fallback || (reason ? `The edge refused (${reason}).` : 'The edge refused.')
}

// DETAILED are the reasons whose message from the edge says more than
// the table's sentence (the amounts): the page shows both.
const DETAILED = new Set(['belowMinimumCharge'])

export function refusal (ans) {
  if (DETAILED.has(ans.reason) && ans.error) {
    return `${words(ans.reason)} ${ans.error.charAt(0).toUpperCase()}${ans.error.slice(1)}.`
  }
  return words(ans.reason, ans.error)
}

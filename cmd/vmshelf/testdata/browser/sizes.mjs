// Scenario: size refusals in the browser, before any ticket: a file larger
// than --upload-max-gib (tooLarge) and a QCOW2 whose disk is larger than
// --max-virtual-gib (virtualSizeTooLarge), each in words naming both sizes.
// Env: PAGE_BIG (too large a file), PAGE_VIRT (too large a disk).
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const big = b.env('PAGE_BIG');
  const virt = b.env('PAGE_VIRT');
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await b.choose(page, [big, virt]);
  const tooLarge = await b.untilState(page, path.basename(big), 'refused', 20000);
  const virtual = await b.untilState(page, path.basename(virt), 'refused', 20000);
  const tickets = await b.control('tickets');
  await ctx.close();
  return { tooLarge, virtual, tickets };
});

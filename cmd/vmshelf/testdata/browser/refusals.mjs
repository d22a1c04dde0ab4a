// Scenario: refusals in words. A file that is no QCOW2 and a QCOW2 with a
// backing file are refused in the browser before any ticket (the Go test checks its ticket counter when
// the script asks); then with a quota of one image two QCOW2 files chosen
// at once: one is stored, the other refused with imageQuota.
// Env: PAGE_JUNK (not a QCOW2), PAGE_BACKED (an overlay), PAGE_FILE, PAGE_FILE2.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const junk = b.env('PAGE_JUNK');
  const backed = b.env('PAGE_BACKED');
  const one = b.env('PAGE_FILE');
  const two = b.env('PAGE_FILE2');
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);

  await b.choose(page, [junk, backed]);
  const notQcow2 = await b.untilState(page, path.basename(junk), 'refused', 20000);
  const backedRow = await b.untilState(page, path.basename(backed), 'refused', 20000);
  const tickets = await b.control('tickets');
  await b.shot(page, 'machines-refused.png', { selector: '#images' });

  await b.choose(page, [one, two]);
  const rows = [];
  for (const f of [one, two]) rows.push(await b.untilState(page, path.basename(f), ['done', 'refused'], 60000));
  const listed = await b.untilImages(page, 1);
  await ctx.close();
  return { notQcow2, backed: backedRow, tickets, rows, listed };
});

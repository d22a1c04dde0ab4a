// Scenario: cancel an upload in the middle: the row says cancelled, the
// edge ends the session (the Go test checks when the script asks), and
// after a reload no unfinished upload is offered for resuming.
// Env: PAGE_FILE.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await b.choose(page, [file]);
  const mid = await b.untilProgress(page, name, 10);
  await page.locator(`${b.rowSel(name)} button.upload-cancel`).click();
  const cancelled = await b.untilState(page, name, 'cancelled', 20000);
  const edge = await b.control('cancelled');
  await page.reload();
  await b.ready(page);
  const rows = await page.evaluate(() => [...document.querySelectorAll('#upload-list li.upload')].map((li) => li.dataset.state));
  const store = await b.storage(page);
  await ctx.close();
  return { mid, cancelled, edge, rows, store };
});

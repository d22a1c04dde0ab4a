// Scenario: the edge goes away for good in the middle of an upload. On the
// page's fake clock the script jumps over every retry delay; the row must
// end refused with reason network, in words, with a Retry button, never
// stuck at "uploading". Then the Go test starts serve again (same data dir
// and ports), Retry is pressed and the upload finishes from where it was.
// Env: PAGE_FILE.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await page.clock.install();
  await b.signIn(page);
  await b.choose(page, [file]);
  const mid = await b.untilProgress(page, name, 10);
  await b.control('stop');
  const sel = b.rowSel(name);
  // Each jump fires the pending retry; the attempt fails at once (nothing
  // listens) and the row says so with one try less. Bounded: the page has
  // ten delays.
  let last = '';
  let jumps = 0;
  for (; jumps < 20; jumps++) {
    const cur = await b.row(page, name);
    if (cur.state === 'refused') break;
    if (cur.state !== 'uploading' && cur.state !== 'retrying') throw new Error(`row ${JSON.stringify(cur)} while the edge is down`);
    last = cur.status;
    await page.clock.fastForward(31000);
    try {
      await page.waitForFunction(([sel, last]) => {
        const li = document.querySelector(sel);
        return li && (li.dataset.state === 'refused' || (li.querySelector('.upload-status')?.textContent || '').trim() !== last);
      }, [sel, last], { timeout: 15000, polling: 50 });
    } catch (e) {
      throw new Error(`the row did not move on after a jump of 31 s: ${JSON.stringify(await b.row(page, name))}`);
    }
  }
  const stopped = await b.untilState(page, name, 'refused', 1000);
  const retryButton = await page.locator(`${sel} button.upload-retry`).isVisible();
  await b.control('start');
  await page.locator(`${sel} button.upload-retry`).click();
  const done = await b.untilState(page, name, 'done', 60000);
  const listed = await b.untilImages(page, 1);
  await ctx.close();
  return { mid, jumps, stopped, retryButton, done, listed };
});

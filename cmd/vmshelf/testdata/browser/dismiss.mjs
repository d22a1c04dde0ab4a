// Scenario: Dismiss on a row the edge refused mid-upload while this
// browser keeps the upload's session address in localStorage. The edge's
// disk "fills" at the first PATCH (the browser answers for it: 507
// noSpace, the edge's JSON); the row is refused, Retry and Dismiss shown.
// Tab reaches Dismiss from Retry, Enter presses it: the row goes, the
// localStorage entry goes, the session ends on the edge (the Go test
// counts status.sessions when asked), and after a reload nothing of it
// comes back.
// Env: PAGE_FILE.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  const origin = new URL(b.env('PAGE_URL')).origin;
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await page.route('**/*', (route) => {
    if (route.request().method() !== 'PATCH') return route.continue();
    return route.fulfill({
      status: 507, contentType: 'application/json',
      headers: {
        'Access-Control-Allow-Origin': origin, 'Access-Control-Expose-Headers': 'Upload-Offset, Tus-Resumable',
        'Tus-Resumable': '1.0.0',
      },
      body: JSON.stringify({ error: "the edge's disk is full", reason: 'noSpace' }),
    });
  });
  await b.signIn(page);
  await b.choose(page, [file]);
  const refused = await b.untilState(page, name, 'refused', 30000);
  const sel = b.rowSel(name);
  const buttons = await page.evaluate((sel) => [...document.querySelectorAll(`${sel} button`)]
    .filter((e) => e.checkVisibility()).map((e) => e.className), sel);
  const storeBefore = await b.storage(page);
  const edgeBefore = await b.control('sessions');
  await page.locator(`${sel} button.upload-retry`).focus();
  const tabs = await b.tabTo(page, `${sel} button.upload-dismiss`, 5);
  await page.keyboard.press('Enter');
  await page.waitForSelector(sel, { state: 'detached', timeout: 10000 });
  await page.waitForSelector('body:not([data-loading])', { state: 'attached', timeout: 10000 });
  const storeAfter = await b.storage(page);
  const edgeAfter = await b.control('sessions');
  await page.unroute('**/*');
  await page.reload();
  await b.ready(page);
  const rowsAfterReload = await page.evaluate(() => document.querySelectorAll('#upload-list li.upload').length);
  await ctx.close();
  return { refused, buttons, storeBefore, edgeBefore, tabs, storeAfter, edgeAfter, rowsAfterReload };
});

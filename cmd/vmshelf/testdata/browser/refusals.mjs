// Scenario: refusals in words. A file that is no QCOW2 and a QCOW2 with a
// backing file are refused in the browser before any ticket (the Go test checks its ticket counter when
// the script asks); then with a quota of one image two QCOW2 files chosen
// at once: one is stored, the other refused with imageQuota. A refused
// row shows no bar, only its reason, and a Dismiss button that Tab
// reaches and Enter presses; at 1 of 1 images the file input is closed
// with a sentence saying why and what to do.
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
  const refusedRow = await page.evaluate((sel) => {
    const li = document.querySelector(sel);
    const shown = (c) => [...li.querySelectorAll(c)].some((e) => e.checkVisibility());
    return { bar: shown('progress'), numbers: shown('.upload-numbers'), dismiss: shown('button.upload-dismiss') };
  }, b.rowSel(path.basename(junk)));
  // By keyboard: from the Upload button, Tab reaches the row's Dismiss;
  // Enter removes the row (and only it).
  await page.locator('#upload-start').focus();
  const tabs = await b.tabTo(page, `${b.rowSel(path.basename(junk))} button.upload-dismiss`);
  await page.keyboard.press('Enter');
  await page.waitForSelector(b.rowSel(path.basename(junk)), { state: 'detached', timeout: 10000 });
  const dismissed = { tabs, left: await page.evaluate(() => [...document.querySelectorAll('#upload-list li.upload')].map((li) => li.dataset.file)) };

  await b.choose(page, [one, two]);
  const rows = [];
  for (const f of [one, two]) rows.push(await b.untilState(page, path.basename(f), ['done', 'refused'], 60000));
  const listed = await b.untilImages(page, 1);
  await page.waitForSelector('#upload-file:disabled', { timeout: 10000 });
  const full = await page.evaluate(() => ({
    inputDisabled: document.getElementById('upload-file').disabled,
    startDisabled: document.getElementById('upload-start').disabled,
    sentence: document.getElementById('upload-full').checkVisibility() ? document.getElementById('upload-full').textContent.trim() : '',
    describedBy: document.getElementById('upload-file').getAttribute('aria-describedby') || '',
  }));
  await ctx.close();
  return { notQcow2, backed: backedRow, tickets, refusedRow, dismissed, rows, listed, full };
});

// Scenario: sign in, upload one QCOW2, see the bar reach 100 % and the image
// listed (the Go test checks the SHA-256 the page shows against its own).
// Env: PAGE_FILE, the image.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.open(page);
  // Without a token only the token form shows.
  const before = {
    tokenLabel: await page.evaluate(() => {
      const i = document.getElementById('token');
      return { type: i?.type, label: (i?.labels?.[0]?.textContent || i?.getAttribute('aria-label') || '').trim() };
    }),
    uploadVisible: await page.locator('#upload-file').isVisible(),
  };
  await page.locator('#token').fill(b.env('PAGE_TOKEN'));
  await page.locator('#token-save').click();
  await b.ready(page);
  const empty = await b.images(page);
  await b.shot(page, 'machines-empty.png');

  await b.choose(page, [file]);
  const mid = await b.untilState(page, name, ['uploading', 'done']);
  const done = await b.untilState(page, name, 'done');
  const listed = await b.untilImages(page, 1);
  const store = await b.storage(page);
  const url = page.url();
  // Reloaded, the tab still knows the token (sessionStorage) and lists the
  // image.
  await page.reload();
  await b.ready(page);
  const afterReload = await b.images(page);
  await ctx.close();
  return { before, empty, mid, done, listed, afterReload, store, url };
});

// Scenario: three files chosen at once on an edge that runs one transfer at
// a time (--max-transfers 1): the recorder sees every row change; the Go
// test checks that never two rows were uploading at once and that all
// three end done.
// Env: PAGE_FILE1, PAGE_FILE2, PAGE_FILE3.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const files = ['PAGE_FILE1', 'PAGE_FILE2', 'PAGE_FILE3'].map(b.env);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const limit = await page.evaluate(() => document.getElementById('image-quota')?.textContent || '');
  await b.choose(page, files);
  const rows = [];
  for (const f of files) rows.push(await b.untilState(page, path.basename(f), 'done', 90000));
  const listed = await b.untilImages(page, 3);
  await ctx.close();
  return { limit, rows, listed };
});

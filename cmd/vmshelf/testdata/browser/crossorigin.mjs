// Scenario: the Machines page on one origin uploads to a data plane on
// another (two loopback addresses), as a laptop does with the page of a
// box on its LAN. PAGE_WANT is the row's end: done (the page's origin is
// allowed, as by default) or refused (it is not: the page must say the
// browser blocked it, in words; the Go test checks the ticket went back).
// Env: PAGE_FILE, the image; PAGE_WANT, done or refused.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const want = b.env('PAGE_WANT');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.open(page);
  await b.signIn(page);
  await b.ready(page);
  await b.choose(page, [file]);
  const end = await b.untilState(page, name, want, 90000);
  const listed = await b.untilImages(page, want === 'done' ? 1 : 0);
  const origin = await page.evaluate(() => location.origin);
  await ctx.close();
  return { end, listed, origin };
});

// Scenario: the page and the uploads through nginx (one origin; the Go test
// starts nginx with a body limit). PAGE_WANT is "done" (the upload must
// finish) or a reason code the upload must be refused with.
// Env: PAGE_FILE, PAGE_WANT.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const want = b.env('PAGE_WANT');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await b.choose(page, [file]);
  if (want === 'done') {
    const done = await b.untilState(page, name, 'done', 90000);
    const listed = await b.untilImages(page, 1);
    await ctx.close();
    return { done, listed };
  }
  const refused = await b.untilState(page, name, 'refused', 90000);
  const msg = await b.message(page);
  await ctx.close();
  return { refused, message: msg };
});

// Scenario: upload one QCOW2 while the Go test restarts serve in the middle
// (it watches the bytes pass its proxy); the upload must resume and finish.
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
  await b.untilProgress(page, name, 5);
  // For the picture: once the row shows its speed and time left.
  await b.shot(page, 'machines-uploading.png', {
    selector: '#images',
    before: () => page.waitForFunction((sel) => {
      const li = document.querySelector(sel);
      return li && li.querySelector('.upload-speed')?.textContent.trim() && li.querySelector('.upload-eta')?.textContent.trim();
    }, b.rowSel(name), { timeout: 10000, polling: 50 }).catch(() => b.log('no speed shown for the screenshot')),
  });
  // The Go test restarts serve once it has seen half the bytes; meanwhile
  // the page retries.
  const done = await b.untilState(page, name, 'done', 120000);
  const listed = await b.untilImages(page, 1);
  await ctx.close();
  return { done, listed };
});

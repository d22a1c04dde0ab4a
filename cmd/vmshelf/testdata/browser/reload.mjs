// Scenario: reload the page in the middle of an upload and choose the same
// file: it resumes its session; then close the browser in the middle and
// launch it again on the same profile: it resumes again and finishes.
// Env: PAGE_FILE.
import path from 'node:path';
import * as b from './lib.mjs';

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  let ctx = await b.launch();
  let page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await b.choose(page, [file]);
  const beforeReload = await b.untilProgress(page, name, 20);
  b.log('reload at', beforeReload.value, '%');
  await page.reload();
  await b.ready(page); // the token is still in this tab's sessionStorage
  // status.sessions: the unfinished upload is listed, waiting for its file.
  const waiting = await b.untilSession(page, beforeReload.uploadId);
  const storeMid = await b.storage(page);
  await b.choose(page, [file]);
  const afterReload = await b.untilProgress(page, name, Math.min(beforeReload.value + 10, 60));

  b.log('browser restart at', afterReload.value, '%');
  const storeBeforeClose = await b.storage(page);
  await ctx.close();
  ctx = await b.launch(); // the same profile dir: localStorage survives, sessionStorage does not
  page = await b.firstPage(ctx);
  track(page);
  await b.open(page);
  const tokenForgotten = await page.locator('#token').isVisible();
  await b.signIn(page);
  const storeAfterRestart = await b.storage(page);
  const waitingAgain = await b.untilSession(page, beforeReload.uploadId);
  await b.choose(page, [file]);
  const done = await b.untilState(page, name, 'done', 90000);
  const listed = await b.untilImages(page, 1);
  const storeEnd = await b.storage(page);
  await ctx.close();
  return { beforeReload, waiting, storeMid, afterReload, storeBeforeClose, storeAfterRestart, tokenForgotten, waitingAgain, done, listed, storeEnd };
});

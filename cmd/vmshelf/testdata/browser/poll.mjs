// Scenario: status polling on the page's clock (Playwright's fake timers,
// paused, so no real 15 s pass and nothing fires unless the script moves
// the clock). With an order awaiting payment the page asks for status
// again 15 s after the last answer, not before; the tab regaining focus
// (window focus, document visibilitychange) asks at once; once the order
// has ended (the Go test expires its checkout) a minute passes without a
// request.
// Env: PAGE_ORDER (the order awaiting payment).
import * as b from './lib.mjs';

// Notes the page clock's time of every status request. The page's fetch
// is called synchronously from its timer and event handlers, so once
// runFor returns, a request a timer made is in the list.
const noteStatus = () => {
  const f = window.fetch;
  window.__statusAt = [];
  window.fetch = function (input, init) {
    if (String(input) === '/market/vms/status') window.__statusAt.push(Date.now());
    return f.apply(this, arguments);
  };
};

b.main(async (track) => {
  const order = b.env('PAGE_ORDER');
  const ctx = await b.launch();
  await ctx.addInitScript(noteStatus);
  const page = await b.firstPage(ctx);
  track(page);
  // Installed before the page loads, so every timer of the page is fake.
  await page.clock.install();
  const orderSel = `#machine-list li[data-order-id="${order}"]`;
  const asked = () => page.evaluate(() => window.__statusAt.slice());
  const now = () => page.evaluate(() => Date.now());
  // refreshed presses #refresh and waits until its answer is rendered (the
  // order's row is a new element then, and the next poll is scheduled);
  // it returns the page clock's time then.
  const refreshed = async () => {
    await page.evaluate((sel) => { document.querySelector(sel).dataset.old = 'true'; }, orderSel);
    await page.locator('#refresh').click();
    await page.waitForSelector(`${orderSel}:not([data-old])`, { timeout: 10000 });
    return now();
  };

  await b.signIn(page);
  await page.clock.pauseAt((await now()) + 1000);
  const busyState = await page.evaluate((sel) => document.querySelector(sel)?.dataset.state || '', orderSel);
  const t0 = await refreshed();
  const n0 = (await asked()).length;
  await page.clock.runFor(14000);
  const by14 = (await asked()).length - n0;
  await page.clock.runFor(1500);
  const polls = (await asked()).slice(n0).map((at) => at - t0);

  // The tab regains focus: window focus, then visibilitychange.
  let n = (await asked()).length;
  await page.evaluate(() => window.dispatchEvent(new Event('focus')));
  const onFocus = (await asked()).length - n;
  n = (await asked()).length;
  const visibility = await page.evaluate(() => { document.dispatchEvent(new Event('visibilitychange')); return document.visibilityState; });
  const onVisible = (await asked()).length - n;

  // The order ends: nothing is on its way any more.
  await b.control('expire');
  await refreshed();
  const endedState = await page.evaluate((sel) => document.querySelector(sel)?.dataset.state || '', orderSel);
  n = (await asked()).length;
  await page.clock.runFor(60000);
  const idle60 = (await asked()).length - n;
  await ctx.close();
  return { busyState, by14, polls, onFocus, visibility, onVisible, endedState, idle60 };
});

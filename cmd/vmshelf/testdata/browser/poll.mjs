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
  // rendered runs action (which makes the page ask for status) and waits
  // until that answer is rendered: the order's row is a new element then.
  // Waiting matters: a request asked for while one is on its way is
  // coalesced into a second load after it, so counting the next trigger's
  // request before the last answer arrived would miss it.
  const rendered = async (action) => {
    await page.evaluate((sel) => { document.querySelector(sel).dataset.old = 'true'; }, orderSel);
    const result = await action();
    await page.waitForSelector(`${orderSel}:not([data-old])`, { timeout: 10000 });
    return result;
  };
  // refreshed presses #refresh, waits until its answer is rendered (and the
  // next poll is scheduled) and returns the page clock's time then.
  const refreshed = async () => {
    await rendered(() => page.locator('#refresh').click());
    return now();
  };
  // counted runs action and returns how many status requests it made at
  // once (the page's fetch is called synchronously from its handlers),
  // then waits until the answer is rendered.
  const counted = (action) => rendered(async () => {
    const n = (await asked()).length;
    await action();
    return (await asked()).length - n;
  });

  await b.signIn(page);
  await page.clock.pauseAt((await now()) + 1000);
  const busyState = await page.evaluate((sel) => document.querySelector(sel)?.dataset.state || '', orderSel);
  const t0 = await refreshed();
  const n0 = (await asked()).length;
  await page.clock.runFor(14000);
  const by14 = (await asked()).length - n0;
  await rendered(() => page.clock.runFor(1500));
  const polls = (await asked()).slice(n0).map((at) => at - t0);

  // The tab regains focus: window focus, then visibilitychange.
  const onFocus = await counted(() => page.evaluate(() => window.dispatchEvent(new Event('focus'))));
  let visibility = '';
  const onVisible = await counted(async () => {
    visibility = await page.evaluate(() => { document.dispatchEvent(new Event('visibilitychange')); return document.visibilityState; });
  });

  // The order ends: nothing is on its way any more.
  await b.control('expire');
  await refreshed();
  const endedState = await page.evaluate((sel) => document.querySelector(sel)?.dataset.state || '', orderSel);
  const n = (await asked()).length;
  await page.clock.runFor(60000);
  const idle60 = (await asked()).length - n;
  await ctx.close();
  return { busyState, by14, polls, onFocus, visibility, onVisible, endedState, idle60 };
});

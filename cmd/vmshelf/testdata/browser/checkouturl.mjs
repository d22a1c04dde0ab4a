// Scenario: the page only sends the buyer to a checkout_url that is an
// https URL (http only on a loopback host, a development edge's fake
// Stripe). The test rewrites the edge's answers (the order's and status's
// checkout_url) to PAGE_BAD_URLS one order each, and PAGE_GOOD_URL for a
// last one: a bad one opens no tab and is nowhere an href, and the page
// says so in words; the good one is the order's link.
// Env: PAGE_LISTING (the offer), PAGE_BAD_URLS (JSON array), PAGE_GOOD_URL.
import * as b from './lib.mjs';

b.main(async (track) => {
  const listing = b.env('PAGE_LISTING');
  const bad = JSON.parse(b.env('PAGE_BAD_URLS'));
  const good = b.env('PAGE_GOOD_URL');
  const ctx = await b.launch();
  // Any tab the page opens lands on a stand-in, never the network.
  await ctx.route(/^https?:\/\/(?!127\.0\.0\.1:\d+\/(machines|market))/, (route) =>
    route.fulfill({ status: 200, contentType: 'text/html', body: '<title>checkout</title>stand-in' }));
  const urlOf = new Map(); // order id -> the checkout_url the page is given
  let next = null; // the checkout_url of the next order answer
  await ctx.route('**/market/vms/orders', async (route) => {
    const res = await route.fetch();
    const data = await res.json();
    if (data.order_id && next !== null) {
      data.checkout_url = next;
      urlOf.set(data.order_id, next);
    }
    await route.fulfill({ response: res, json: data });
  });
  await ctx.route('**/market/vms/status', async (route) => {
    const res = await route.fetch();
    const data = await res.json();
    for (const o of data.orders || []) {
      if (urlOf.has(o.order_id) && o.checkout_url) o.checkout_url = urlOf.get(o.order_id);
    }
    await route.fulfill({ response: res, json: data });
  });
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);

  const results = [];
  let i = 0;
  for (const url of [...bad, good]) {
    next = url;
    const pagesBefore = ctx.pages().length;
    await page.locator('#order-image').selectOption('debian-13');
    await page.locator('#order-name').fill(`web-${i++}`);
    await page.locator('#order-listing').selectOption(listing);
    await page.locator('#order-quantity').fill('1');
    await page.locator('#order-submit').click();
    await page.waitForFunction(() => {
      const r = document.getElementById('order-result');
      return r && ['placed', 'refused'].includes(r.dataset.state) && r.dataset.orderId !== window.__lastOrder;
    }, null, { timeout: 20000, polling: 100 });
    const r = await page.evaluate(() => {
      const res = document.getElementById('order-result');
      window.__lastOrder = res.dataset.orderId;
      return { state: res.dataset.state, reason: res.dataset.reason || '', orderId: res.dataset.orderId || '', text: res.textContent };
    });
    // Opened tabs: the one for a good URL has navigated to it; for a bad
    // one, none may be left open.
    const opened = [];
    for (const p of ctx.pages().slice(pagesBefore)) {
      // The page sets the tab's address in the task that marks the order
      // placed; the navigation commits after: wait for it (bounded), not
      // for about:blank's own load.
      try { await p.waitForURL((u) => u.href !== 'about:blank', { timeout: 5000 }); } catch (e) {}
      opened.push(p.url());
      await p.close();
    }
    r.opened = opened;
    r.url = url;
    results.push(r);
  }
  await page.locator('#refresh').click();
  await page.waitForFunction((n) => document.querySelectorAll('#machine-list li[data-order-id]').length >= n,
    results.length, { timeout: 20000, polling: 100 });
  const hrefs = await page.evaluate(() => [...document.querySelectorAll('a[href]')].map((a) => a.getAttribute('href')));
  const machines = await page.evaluate(() => [...document.querySelectorAll('#machine-list li[data-order-id]')].map((li) => ({
    order: li.dataset.orderId,
    pay: li.querySelector('a.order-pay')?.getAttribute('href') || '',
    refused: (li.querySelector('.order-pay-refused')?.textContent || '').trim(),
  })));
  await ctx.close();
  return { results, hrefs, machines };
});

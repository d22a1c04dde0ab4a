// Scenario: order two replicas of a catalogue system from another host's
// offer; the page opens Stripe Checkout (the fake's URL) in a new tab; the
// Go test pays it and posts the signed webhook; the machine appears with
// its replicas; the Go test sets their state in the cluster (when it has
// one) and #refresh shows it. The browser runs in a zone far from UTC; the
// page's times must still be UTC. Where the sections are is read before
// the order (nothing of the box's own: images first) and after it (its
// machine first), with the page's height on a desktop and a phone.
// Env: PAGE_LISTING (the offer), PAGE_IMAGE (a catalogue id).
import * as b from './lib.mjs';

b.main(async (track) => {
  const report = {};
  const listing = b.env('PAGE_LISTING');
  const image = b.env('PAGE_IMAGE');
  const ctx = await b.launch(undefined, b.desktop, { timezoneId: b.farZone });
  // The fake's checkout URL is not on loopback: the tab gets a stand-in.
  await ctx.route('https://checkout.stripe.test/**', (route) =>
    route.fulfill({ status: 200, contentType: 'text/html', body: '<title>checkout</title>fake checkout' }));
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const layoutBefore = await b.layout(page);
  const offer = await page.evaluate((id) => {
    const li = document.querySelector(`#offer-list li[data-listing-id="${id}"]`);
    return li ? li.textContent.replace(/\s+/g, ' ').trim() : null;
  }, listing);
  const catalogue = await page.evaluate(() => [...document.querySelectorAll('#catalogue-list li[data-image-id]')].map((li) => li.dataset.imageId));

  await page.locator('#order-image').selectOption(image);
  await page.locator('#order-name').fill('web');
  await page.locator('#order-listing').selectOption(listing);
  await page.locator('#order-quantity').fill('2');
  await page.locator('#order-user-data').fill('#cloud-config\n' + b.env('PAGE_USER_DATA') + '\n');
  const popupP = ctx.waitForEvent('page', { timeout: 20000 });
  await page.locator('#order-submit').click();
  const popup = await popupP;
  await popup.waitForURL(/^https:\/\/checkout\.stripe\.test\//, { timeout: 20000 });
  const checkoutTab = popup.url();
  await page.waitForSelector('#order-result a#order-checkout[href]', { timeout: 20000 });
  const link = await page.evaluate(() => {
    const a = document.getElementById('order-checkout');
    return { href: a.href, target: a.target, rel: a.rel };
  });
  await popup.close();
  // Ordered, not paid: the machine is listed awaiting payment.
  await page.waitForSelector('#machine-list li[data-order-id]', { timeout: 20000 });
  const beforePay = await page.evaluate(() => {
    const li = document.querySelector('#machine-list li[data-order-id]');
    return { order: li.dataset.orderId, state: li.dataset.state, stateText: li.querySelector('.order-state')?.textContent.trim() || '' };
  });

  const paid = await b.control('pay', { checkout_url: checkoutTab });
  await page.locator('#refresh').click();
  const orderSel = `#machine-list li[data-order-id="${paid.order_id}"]`;
  await page.waitForFunction((sel) => {
    const li = document.querySelector(sel);
    return li && li.dataset.state !== 'awaitingPayment' && li.querySelectorAll('ul.replicas li.replica').length === 2;
  }, orderSel, { timeout: 20000, polling: 100 });
  const readOrder = () => page.evaluate((sel) => {
    const li = document.querySelector(sel);
    const text = (el, c) => (el.querySelector(c)?.textContent || '').replace(/\s+/g, ' ').trim();
    return {
      state: li.dataset.state, name: text(li, '.order-name'), stateText: text(li, '.order-state'),
      address: text(li, '.order-address'), expires: text(li, '.order-expires'), note: text(li, '.order-note'),
      meta: text(li, '.meta'),
      replicas: [...li.querySelectorAll('ul.replicas li.replica')].map((r) => ({
        replica: r.dataset.replica, state: r.dataset.state, name: text(r, '.replica-name'), stateText: text(r, '.replica-state'),
        consoles: [...r.querySelectorAll('button.replica-console, button.replica-serial')].map((b) => b.textContent),
      })),
    };
  }, orderSel);
  const afterPay = await readOrder();

  // The cluster's word (the Go test sets it when it runs a fake cluster).
  let afterKube = null;
  const kube = await b.control('kube', { order_id: paid.order_id });
  if (kube.replicas) {
    const want = kube.replicas; // replica name -> state
    await page.locator('#refresh').click();
    try {
      await page.waitForFunction(([sel, want]) => {
        const li = document.querySelector(sel);
        return li && Object.entries(want).every(([n, st]) =>
          [...li.querySelectorAll('li.replica')].some((r) => r.dataset.replica === n && r.dataset.state === st));
      }, [orderSel, want], { timeout: 20000, polling: 100 });
    } catch (e) {
      throw new Error(`the replicas did not show ${JSON.stringify(want)}: ${JSON.stringify(await readOrder())}`);
    }
    afterKube = await readOrder();
  }
  await b.shot(page, 'machines-listed.png', { selector: '#machines' });
  await b.shot(page, 'machines-desktop.png');
  // The heights are the page's as an edge with Stripe's own API shows it:
  // this test's serve, --dev with a stand-in on loopback, is a trial edge,
  // whose banner (no money moves) the budget leaves out.
  report.demoBanner = await page.evaluate(() => {
    const d = document.getElementById('demo-payments');
    const shown = !!d && !d.hidden;
    if (d) d.hidden = true;
    return shown;
  });
  const layoutAfter = await b.layout(page);
  const heights = { desktop: layoutAfter.height };
  await page.setViewportSize(b.phone);
  heights.phone = (await b.layout(page)).height;
  b.log('page heights (px):', JSON.stringify(heights));
  // Each section's height on the phone, so that a page over its budget
  // says which part grew.
  b.log('phone sections (px):', JSON.stringify(await page.evaluate(() => Object.fromEntries(
    [...document.querySelectorAll('body > *, #app > *')].filter((e) => e.id && e.getBoundingClientRect().height > 0)
      .map((e) => [e.id, Math.round(e.getBoundingClientRect().height)])))), 'message:', await b.message(page));
  const phoneOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  await b.shot(page, 'machines-phone.png');
  const store = await b.storage(page);
  await ctx.close();
  return { ...report, offer, catalogue, checkoutTab, link, beforePay, paid, afterPay, afterKube, phoneOverflow, heights, layoutBefore, layoutAfter, store };
});

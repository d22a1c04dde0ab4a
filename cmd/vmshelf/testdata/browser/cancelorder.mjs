// Scenario: the buyer sees what an offer's replica is and what an order
// costs before paying, sees why "Order and pay" is off once the offer is
// full, and cancels the unpaid order that filled it from its machine card:
// the offer's free count comes back, and the button with it. The edge runs
// without --vms-domain: the machine says how it is reached.
// Env: PAGE_LISTING (the offer, 2 replicas), PAGE_IMAGE (a catalogue id
// with no minimum above the edge's sizes), PAGE_BIG_MEMORY and
// PAGE_BIG_DISK (catalogue ids that need more memory, more disk).
import * as b from './lib.mjs';

b.main(async (track) => {
  const listing = b.env('PAGE_LISTING');
  const offerSel = `#offer-list li[data-listing-id="${listing}"]`;
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await page.waitForSelector(offerSel, { timeout: 20000 });
  const text = (sel) => page.evaluate((sel) => {
    const e = document.querySelector(sel);
    return e && e.checkVisibility() ? e.textContent.replace(/\s+/g, ' ').trim() : '';
  }, sel);
  const offer = { price: await text(`${offerSel} .offer-price`), size: await text(`${offerSel} .offer-size`), free: await text(`${offerSel} .offer-free`) };

  // The order form, before paying: each replica's size for the image
  // chosen, and the total.
  await page.locator('#order-listing').selectOption(listing);
  await page.locator('#order-quantity').fill('2');
  const summaries = {};
  for (const id of [b.env('PAGE_IMAGE'), b.env('PAGE_BIG_MEMORY'), b.env('PAGE_BIG_DISK')]) {
    await page.locator('#order-image').selectOption(id);
    summaries[id] = {
      text: await text('#order-summary'),
      total: await page.evaluate(() => document.getElementById('order-summary').dataset.total || ''),
    };
  }
  const enabledBefore = await page.evaluate(() => ({
    disabled: document.getElementById('order-submit').disabled, why: document.getElementById('order-disabled').checkVisibility(),
  }));

  // Another order (the Go test's, as this buyer) takes both replicas.
  const { order_id: orderID } = await b.control('fill');
  await page.locator('#refresh').click();
  await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.free === '0' &&
    document.getElementById('order-submit').disabled, offerSel, { timeout: 20000, polling: 100 });
  const full = await page.evaluate(() => {
    const btn = document.getElementById('order-submit');
    const why = document.getElementById('order-disabled');
    const described = (btn.getAttribute('aria-describedby') || '').split(/\s+/);
    return {
      disabled: btn.disabled, why: why.dataset.why || '', visible: why.checkVisibility(),
      text: why.textContent.trim(), describedBy: described.includes(why.id),
    };
  });
  full.offerFree = await text(`${offerSel} .offer-free`);

  // The unpaid order's card: its address, and Cancel order.
  const card = `#machine-list li[data-order-id="${orderID}"]`;
  await page.waitForSelector(`${card}[data-state="awaitingPayment"] button.order-cancel`, { timeout: 20000 });
  const unpaid = { address: await text(`${card} .order-address`), button: await text(`${card} button.order-cancel`) };
  await page.locator(`${card} button.order-cancel`).click();
  await page.waitForFunction(([card, offerSel]) => document.querySelector(card)?.dataset.state === 'cancelled' &&
    document.querySelector(offerSel)?.dataset.free === '2', [card, offerSel], { timeout: 20000, polling: 100 });
  const after = await page.evaluate(([card, offerSel]) => {
    const li = document.querySelector(card);
    return {
      state: li.dataset.state, cancelButton: !!li.querySelector('button.order-cancel'),
      note: (li.querySelector('.order-note')?.textContent || '').trim(),
      free: document.querySelector(offerSel).dataset.free,
      disabled: document.getElementById('order-submit').disabled,
      why: document.getElementById('order-disabled').checkVisibility(),
      message: document.getElementById('message').textContent.trim(),
    };
  }, [card, offerSel]);
  after.offerFree = await text(`${offerSel} .offer-free`);
  const atEdge = await b.control('cancelled', { order_id: orderID });
  await ctx.close();
  return { offer, summaries, enabledBefore, orderID, full, unpaid, after, atEdge };
});

// Scenario: the buyer's Machines page shows its orders' refunds and
// disputes in words: a late payment refunded, a refund Stripe failed, a
// disputed charge the bank decided, a refund held by a dispute. The Go
// test made them through the binary.
// Env: PAGE_ORDERS (comma-separated order ids).
import * as b from './lib.mjs';

b.main(async (track) => {
  const ids = b.env('PAGE_ORDERS').split(',');
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const orders = {};
  for (const id of ids) {
    const sel = `#machine-list li[data-order-id="${id}"]`;
    await page.waitForSelector(sel, { timeout: 20000 });
    orders[id] = await page.evaluate((sel) => {
      const li = document.querySelector(sel);
      const text = (c) => { const e = li.querySelector(c); return e && e.checkVisibility() ? e.textContent : ''; };
      const refund = li.querySelector('.order-refund');
      const dispute = li.querySelector('.order-disputed');
      return {
        state: li.dataset.state,
        stateText: text('.order-state'),
        refund: text('.order-refund'),
        cause: refund ? refund.dataset.cause : '',
        disputed: text('.order-disputed'),
        dispute: dispute ? dispute.dataset.dispute : '',
        held: text('.order-refund-held'),
      };
    }, sel);
  }
  await b.shot(page, 'machines-refunds.png', { selector: '#machine-list' });
  await ctx.close();
  return { orders };
});

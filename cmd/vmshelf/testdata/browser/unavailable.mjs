// Scenario: a tenant whose status says available:false reads why and sees
// no forms; where the sections stand (b.layout).
import * as b from './lib.mjs';

b.main(async (track) => {
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const seen = await page.evaluate(() => {
    const u = document.getElementById('unavailable');
    const visible = (id) => {
      const el = document.getElementById(id);
      return !!el && el.getClientRects().length > 0 && getComputedStyle(el).visibility !== 'hidden';
    };
    return {
      hidden: u ? u.hidden : null,
      reason: u?.dataset.reason || '',
      text: (u?.textContent || '').replace(/\s+/g, ' ').trim(),
      visible: Object.fromEntries(['unavailable', 'upload-file', 'upload-start', 'order-form', 'listing-form'].map((id) => [id, visible(id)])),
    };
  });
  seen.layout = await b.layout(page);
  await ctx.close();
  return seen;
});

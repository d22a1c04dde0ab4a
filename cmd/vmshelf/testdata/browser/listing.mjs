// Scenario: the host's listing form. A box that hosts machines and has a
// payout account types "7.50" and is told what it receives of it (half of
// each sale is the platform's), and lists 3 replicas at that price; #listing-list
// shows it (the Go test checks status); Close closes it (the Go test checks
// that it left the offers). With an open listing, what the host hosts
// comes first on the page.
// Env: PAGE_TOKEN is the host's.
import * as b from './lib.mjs';

b.main(async (track) => {
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const formVisible = await page.locator('#listing-form').isVisible();
  await page.locator('#listing-price').fill('7.50');
  const fee = await page.evaluate(() => {
    const p = document.getElementById('listing-fee');
    const described = (document.getElementById('listing-price').getAttribute('aria-describedby') || '').split(/\s+/);
    return { text: p.textContent.trim(), receive: p.dataset.receive || '', visible: p.checkVisibility(), describedBy: described.includes(p.id) };
  });
  await page.locator('#listing-capacity').fill('3');
  await page.locator('#listing-submit').click();
  await page.waitForSelector('#listing-result[data-state="done"]', { timeout: 20000 });
  await page.waitForSelector('#listing-list li[data-listing-id][data-open="true"]', { timeout: 20000 });
  const listed = await page.evaluate(() => [...document.querySelectorAll('#listing-list li[data-listing-id]')].map((li) => ({
    id: li.dataset.listingId, open: li.dataset.open, text: li.textContent.replace(/\s+/g, ' ').trim(),
    closeButton: !!li.querySelector('button.listing-close'),
  })));
  if (listed.length !== 1) throw new Error(`#listing-list has ${listed.length} listings: ${JSON.stringify(listed)}`);
  const id = listed[0].id;
  const atEdge = await b.control('listed', { listing_id: id });
  const layoutListed = await b.layout(page);
  const result = await page.evaluate(() => document.getElementById('listing-result').textContent.trim());

  await page.locator(`#listing-list li[data-listing-id="${id}"] button.listing-close`).click();
  await page.waitForFunction((id) => {
    const res = document.getElementById('listing-result');
    const li = document.querySelector(`#listing-list li[data-listing-id="${id}"]`);
    return res.dataset.state === 'done' && /closed/i.test(res.textContent) && (!li || li.dataset.open === 'false');
  }, id, { timeout: 20000, polling: 100 });
  const after = await page.evaluate((id) => {
    const li = document.querySelector(`#listing-list li[data-listing-id="${id}"]`);
    return li ? { open: li.dataset.open, closeButton: !!li.querySelector('button.listing-close') } : null;
  }, id);
  const closed = await b.control('closed', { listing_id: id });
  await ctx.close();
  return { formVisible, fee, listed, atEdge, result, after, closed, layoutListed };
});

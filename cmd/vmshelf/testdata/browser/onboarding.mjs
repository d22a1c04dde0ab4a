// Scenario: a host without a payout account sets up payouts with Stripe
// from its listings. "Set up payouts with Stripe" takes the tab to the
// fake Stripe's onboarding (PAGE_STRIPE), whose "finish" sends it back to
// the page with ?onboarding=return; the page says it is back and that
// Stripe has not confirmed yet. The test then posts Stripe's signed
// account.updated ("accountUpdated"); after #refresh the page shows
// payouts enabled and the listing form, and a listing made with it is
// taken.
// Env: PAGE_TOKEN is the host's.
import * as b from './lib.mjs';

// payouts reads what the listings section says of the payout account.
async function payouts(page) {
  return page.evaluate(() => {
    const visible = (el) => !!el && el.getClientRects().length > 0 && !el.hidden;
    const ps = document.getElementById('payout-state');
    const btn = document.getElementById('onboarding-start');
    const res = document.getElementById('onboarding-result');
    return {
      state: ps?.dataset.state || '', text: (ps?.textContent || '').trim(),
      button: visible(btn), buttonText: (btn?.textContent || '').trim(),
      form: visible(document.getElementById('listing-form')),
      result: visible(res) ? res.textContent.trim() : '', resultState: res?.dataset.state || '',
      url: location.href,
    };
  });
}

b.main(async (track) => {
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await page.waitForSelector('#onboarding-start:not([hidden])');
  const before = await payouts(page);
  await b.shot(page, 'machines-payouts-setup.png', { selector: '#listings' });

  const stripe = b.env('PAGE_STRIPE');
  await Promise.all([
    page.waitForURL((u) => u.href.startsWith(stripe + '/connect/onboard/'), { timeout: 20000 }),
    page.locator('#onboarding-start').click(),
  ]);
  const atStripe = page.url();
  await Promise.all([
    page.waitForURL((u) => u.pathname === '/machines', { timeout: 20000 }),
    page.locator('#finish').click(),
  ]);
  await b.ready(page);
  await page.waitForSelector('#onboarding-result:not([hidden])');
  const back = await payouts(page);

  await b.control('accountUpdated');
  await page.locator('#refresh').click();
  await page.waitForSelector('#payout-state[data-state="enabled"]', { timeout: 20000 });
  await page.waitForSelector('#listing-form:not([hidden])');
  const confirmed = await payouts(page);
  await b.shot(page, 'machines-payouts-enabled.png', { selector: '#listings' });

  await page.locator('#listing-price').fill('6.00');
  await page.locator('#listing-capacity').fill('1');
  await page.locator('#listing-submit').click();
  await page.waitForSelector('#listing-result[data-state="done"]', { timeout: 20000 });
  const listed = await page.evaluate(() => document.getElementById('listing-result').textContent.trim());
  const store = await b.storage(page);
  await ctx.close();
  return { before, atStripe, back, confirmed, listed, store };
});

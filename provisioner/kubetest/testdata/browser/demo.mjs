// Scenario of TestBootDemo: a newcomer's walk through `make demo`, as its
// printed steps say. Sign in with the dev box's token, see that payments
// are a demo, upload the guest's BIOS disk, order one replica from box1's
// offer, pay on the stand-in's demo page (its banner: no money moves),
// come back to the Machines page, watch the machine until it runs, open
// its serial console and see the login prompt.
// Env (besides lib.mjs's): PAGE_FILE (the guest's disk).
// lib.mjs is cmd/vmshelf's: the same Chromium, playwright-core and
// helpers as the page tests (node resolves playwright-core from there).
import * as b from '../../../../cmd/vmshelf/testdata/browser/lib.mjs';
import path from 'node:path';

const minutes = (n) => n * 60000;

b.main(async (track) => {
  const file = b.env('PAGE_FILE');
  const name = path.basename(file);
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  const report = { seen: [] };

  // 1. Sign in: the page says at once that no money moves here.
  await b.signIn(page);
  await page.waitForSelector('#demo-payments:not([hidden])', { timeout: 20000 });
  report.pageBanner = (await page.locator('#demo-payments').textContent()).trim();
  b.log('the page says:', report.pageBanner);

  // 2. Upload the guest's disk (a BIOS one: the EFI box stays unticked).
  await b.choose(page, [file]);
  const row = await b.untilState(page, name, 'done', minutes(5));
  report.uploadId = row.uploadId;
  b.log('uploaded', name, 'as', row.uploadId);

  // 3. Order one replica of it from box1's offer (the demo listed it).
  await page.waitForFunction((id) => !!document.querySelector(`#order-image option[value="${id}"]`), row.uploadId, { timeout: 30000 });
  await page.locator('#order-image').selectOption(row.uploadId);
  const listing = await page.evaluate(() => [...document.querySelectorAll('#order-listing option')].map((o) => o.value).find((v) => v));
  if (!listing) throw new Error('no offer to order from');
  await page.locator('#order-listing').selectOption(listing);
  await page.locator('#order-name').fill('demo');
  await page.locator('#order-quantity').fill('1');
  const popupP = ctx.waitForEvent('page', { timeout: 20000 });
  await page.locator('#order-submit').click();

  // 4. The checkout opens in a new tab: the stand-in's demo page.
  const pay = await popupP;
  await pay.waitForURL(/\/demo\/checkout\/cs_/, { timeout: 20000 });
  report.checkoutURL = pay.url();
  report.checkoutBanner = (await pay.locator('#demo-banner').textContent()).trim();
  b.log('checkout page', report.checkoutURL, 'says:', report.checkoutBanner);
  await pay.locator('#pay').click();
  // Back on the Machines page, signed in (the tab has the page's session).
  await pay.waitForURL(/\/machines/, { timeout: 30000 });
  await b.ready(pay);
  report.returnedTo = new URL(pay.url()).pathname;
  await pay.waitForSelector('#machine-list li[data-order-id]', { timeout: 30000 });
  report.returnedOrders = await pay.evaluate(() => document.querySelectorAll('#machine-list li[data-order-id]').length);
  b.log('returned to', report.returnedTo, 'signed in, listing', report.returnedOrders, 'machine(s)');
  await pay.close();

  // 5. Watch the machine on the first tab until it runs (the page polls
  // by itself), noting each state it shows.
  const machine = '#machine-list li[data-order-id]';
  const deadline = Date.now() + minutes(15);
  for (;;) {
    const now = await page.evaluate((sel) => {
      const li = document.querySelector(sel);
      if (!li) return null;
      const r = li.querySelector('li.replica');
      const text = (el, c) => (el?.querySelector(c)?.textContent || '').replace(/\s+/g, ' ').trim();
      return { order: li.dataset.state, replica: r?.dataset.state || '', words: r ? text(r, '.replica-state') : text(li, '.order-state') };
    }, machine);
    const key = now && `${now.order}/${now.replica}: ${now.words}`;
    if (key && report.seen[report.seen.length - 1] !== key) {
      report.seen.push(key);
      b.log('the machine:', key);
    }
    if (now && now.order === 'active' && now.replica === 'running') break;
    if (now && (now.replica === 'failed' || ['cancelled', 'refunded', 'refunding'].includes(now.order))) {
      throw new Error(`the machine ended ${key}`);
    }
    if (Date.now() > deadline) throw new Error(`the machine did not run within 15 minutes: ${JSON.stringify(report.seen)}`);
    await page.waitForTimeout(1000);
  }

  // 6. Its serial console: the guest boots in emulation, so the login
  // prompt may take minutes; Enter asks getty to print it again.
  await page.locator(`${machine} li.replica button.replica-serial`).click();
  await page.waitForSelector('#console[data-state="open"][data-kind="serial"]', { timeout: 60000 });
  const serial = () => page.evaluate(() => document.querySelector('#console-serial .xterm-rows')?.textContent || '');
  const loginBy = Date.now() + minutes(15);
  while (!/login:/.test(await serial())) {
    if (Date.now() > loginBy) throw new Error(`no login prompt on the serial console within 15 minutes; it shows: ${(await serial()).slice(-500)}`);
    await page.locator('#console-serial').click();
    await page.keyboard.press('Enter');
    await page.waitForFunction(() => /login:/.test(document.querySelector('#console-serial .xterm-rows')?.textContent || ''), null, { timeout: 15000 }).catch(() => {});
  }
  const text = await serial();
  report.login = text.slice(Math.max(0, text.lastIndexOf('login:') - 80), text.lastIndexOf('login:') + 6).replace(/\s+/g, ' ').trim();
  b.log('the serial console shows:', report.login);
  await ctx.close();
  return report;
});

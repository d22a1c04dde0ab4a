// Scenario: an unused ticket on the page. The box holds an image and an
// unused ticket, its quota is 2: the quota counts the ticket, the file
// input is closed with a sentence naming both ways out, and the ticket is
// listed with its name and its expiry in UTC (the browser runs in a zone
// far from it). Tab reaches its Cancel button; Enter cancels it: the row
// goes and the file input opens again.
// Env: PAGE_TICKET (the ticket's upload id).
import * as b from './lib.mjs';

b.main(async (track) => {
  const id = b.env('PAGE_TICKET');
  const ctx = await b.launch(undefined, b.desktop, { timezoneId: b.farZone });
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const sel = `#ticket-list li[data-upload-id=${JSON.stringify(id)}]`;
  await page.waitForSelector(sel, { timeout: 10000 });
  const form = () => page.evaluate(() => ({
    inputDisabled: document.getElementById('upload-file').disabled,
    sentence: document.getElementById('upload-full').checkVisibility() ? document.getElementById('upload-full').textContent.trim() : '',
  }));
  const before = {
    images: await b.images(page),
    form: await form(),
    ticket: await page.evaluate((sel) => {
      const li = document.querySelector(sel);
      return { text: li.textContent.replace(/\s+/g, ' ').trim(), expires: li.querySelector('.ticket-expires')?.textContent.trim() || '' };
    }, sel),
  };
  await page.locator('#image-list button.image-remove').first().focus();
  const tabs = await b.tabTo(page, `${sel} button.ticket-cancel`, 5);
  await page.keyboard.press('Enter');
  await page.waitForSelector(sel, { state: 'detached', timeout: 10000 });
  await page.waitForSelector('#upload-file:enabled', { timeout: 10000 });
  const after = { images: await b.images(page), form: await form(), message: await b.message(page) };
  const edge = await b.control('tickets');
  await ctx.close();
  return { before, tabs, after, edge };
});

// Scenario: removing an image asks first. The first press of Remove
// removes nothing and offers "Remove for good" and Keep; Keep puts it back;
// Remove, then "Remove for good", removes it (the Go test checks status
// and the data dir at each step).
import * as b from './lib.mjs';

b.main(async (track) => {
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  const before = await b.untilImages(page, 1);
  const id = before.list[0].uploadId;
  const li = `#image-list li[data-upload-id="${id}"]`;
  const buttons = () => page.evaluate((li) => [...document.querySelectorAll(`${li} button`)].map((x) => ({
    class: x.className, text: x.textContent.trim(), disabled: x.disabled,
  })), li);

  await page.locator(`${li} button.image-remove`).click();
  const asked = await buttons();
  const askedMessage = await b.message(page);
  const afterFirst = await b.control('present');
  await page.locator(`${li} button.image-keep`).click();
  const kept = await buttons();
  const keptFocus = await page.evaluate(() => document.activeElement?.className || '');
  const afterKeep = await b.control('present');

  await page.locator(`${li} button.image-remove`).click();
  await page.locator(`${li} button.image-remove`, { hasText: 'Remove for good' }).click();
  await page.waitForSelector(li, { state: 'detached', timeout: 20000 });
  const after = await b.images(page);
  const message = await b.message(page);
  await ctx.close();
  return { before, asked, askedMessage, afterFirst, kept, keptFocus, afterKeep, after, message };
});

// Scenario: the page by keyboard alone. From a fresh page Tab reaches the
// token field; typing the token and Enter signs in; Tab reaches the upload
// file input, the UEFI box, Upload, Refresh and Forget token; Enter on
// Forget token clears sessionStorage and hides the forms.
import * as b from './lib.mjs';

b.main(async (track) => {
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.open(page);
  const active = () => page.evaluate(() => {
    const a = document.activeElement;
    return a ? (a.id ? '#' + a.id : a.tagName.toLowerCase() + (a.className ? '.' + a.className.split(' ')[0] : '')) : '';
  });
  // tabTo presses Tab until want has the focus (bounded), and returns what
  // had it on the way.
  const tabTo = async (want, max) => {
    const seen = [];
    for (let i = 0; i < max; i++) {
      await page.keyboard.press('Tab');
      const a = await active();
      seen.push(a);
      if (a === want) return seen;
    }
    throw new Error(`${max} presses of Tab did not reach ${want}; they went through ${seen.join(' ')}`);
  };
  const toToken = await tabTo('#token', 10);
  await page.keyboard.type(b.env('PAGE_TOKEN'));
  await page.keyboard.press('Enter');
  await b.ready(page);
  const signedIn = await b.storage(page);
  const afterSignIn = await active();
  const want = ['#upload-file', '#upload-efi', '#upload-start', '#refresh', '#token-forget'];
  const order = [];
  for (let i = 0; i < 150 && !want.every((w) => order.includes(w)); i++) {
    await page.keyboard.press('Tab');
    order.push(await active());
  }
  await tabTo('#token-forget', 150);
  // A refresh still on its way when the token is forgotten (the window
  // regained focus, a poll) must not sign the page back in: hold one
  // status answer, forget the token, then let the answer through.
  let release;
  const held = new Promise((resolve) => { release = resolve; });
  let asked;
  const askedP = new Promise((resolve) => { asked = resolve; });
  await page.route('**/market/vms/status', async (route) => {
    asked();
    await held;
    await route.continue();
  });
  const answered = page.waitForResponse('**/market/vms/status', { timeout: 10000 });
  await page.evaluate(() => window.dispatchEvent(new Event('focus')));
  await askedP;
  await page.keyboard.press('Enter');
  release();
  await answered;
  await page.waitForSelector('body:not([data-loading])', { state: 'attached', timeout: 10000 });
  await page.waitForSelector('body[data-ready="false"]', { state: 'attached', timeout: 10000 });
  const message = await page.locator('#message').textContent();
  const forgotten = await b.storage(page);
  const visible = {};
  for (const id of ['token', 'app', 'upload-file', 'upload-start', 'order-form', 'token-forget']) {
    visible[id] = await page.locator('#' + id).isVisible();
  }
  const focusAfterForget = await active();
  await ctx.close();
  return { toToken, signedIn: Object.keys(signedIn.session), afterSignIn, order, forgotten: forgotten.session, visible, focusAfterForget, message };
});

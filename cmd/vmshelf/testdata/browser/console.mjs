// Scenario: the buyer opens a running machine's console in the page. The
// machine is a QEMU guest behind serve; the Go test holds and frees
// consoles, watches the guest's serial line and ends a console on the
// machine's side when asked.
// Env: PAGE_ORDER (the order id), PAGE_REPLICA (its replica's name),
// PAGE_GUEST (the guest's screen colours: {background, bar, text} as RGB).
import * as b from './lib.mjs';

const replica = `#machine-list li[data-order-id="${b.env('PAGE_ORDER')}"] li.replica[data-replica="${b.env('PAGE_REPLICA')}"]`;

// closedWith waits for the console to say it is closed and reads why.
async function closedWith(page) {
  await page.waitForSelector('#console[data-state="closed"]', { timeout: 30000 });
  return page.evaluate(() => ({
    code: document.querySelector('#console').dataset.code || '',
    words: document.querySelector('#console-status').textContent,
  }));
}

// serialText is what the serial console's terminal shows.
function serialText(page) {
  return page.evaluate(() => document.querySelector('#console-serial .xterm-rows')?.textContent || '');
}

// typeLine types a line on the serial console and waits for the guest's
// answer on the terminal.
async function typeLine(page, line) {
  await page.keyboard.type(line);
  await page.keyboard.press('Enter');
  await page.waitForFunction((want) => (document.querySelector('#console-serial .xterm-rows')?.textContent || '').includes(want),
    `echo: ${line}`, { timeout: 30000 });
}

b.main(async (track) => {
  const guest = JSON.parse(b.env('PAGE_GUEST'));
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await page.waitForSelector(`${replica} button.replica-console`, { timeout: 20000 });
  const report = {};

  // Both consoles the box may have are open elsewhere: the page's is
  // refused, in words.
  await b.control('hold');
  await page.click(`${replica} button.replica-console`);
  report.busy = await closedWith(page);
  b.log('busy:', report.busy);
  await b.control('release');

  // Reconnect: the screen, until noVNC's canvas shows the guest's
  // picture (mostly its background, a bar, some banner text).
  await page.click('#console-reconnect');
  await page.waitForSelector('#console[data-state="open"][data-kind="vnc"]', { timeout: 30000 });
  await page.waitForFunction((guest) => {
    const c = document.querySelector('#console-screen canvas');
    if (!c || c.width < 100 || c.height < 100) return false;
    const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    const near = (i, rgb) => Math.abs(px[i] - rgb[0]) + Math.abs(px[i + 1] - rgb[1]) + Math.abs(px[i + 2] - rgb[2]) < 24;
    let bg = 0, bar = 0, text = 0;
    for (let i = 0; i < px.length; i += 4) {
      if (near(i, guest.background)) bg++;
      else if (near(i, guest.bar)) bar++;
      else if (near(i, guest.text)) text++;
    }
    const total = px.length / 4;
    return 2 * bg > total && 20 * bar > total && text > 0;
  }, guest, { timeout: 30000, polling: 250 });
  report.screen = await page.evaluate(() => document.querySelector('#console-screen canvas').toDataURL('image/png'));
  await b.shot(page, 'machines-console.png', { selector: '#console' });

  // Full screen, and back.
  await page.click('#console-full');
  await page.waitForFunction(() => document.fullscreenElement?.id === 'console', null, { timeout: 10000 });
  // The page marks its panel on the fullscreenchange event, which comes
  // after fullscreenElement is set: wait for the mark (bounded), or report
  // that it never came.
  report.fullScreen = await page.waitForFunction(() => document.querySelector('#console').dataset.full === 'true', null, { timeout: 10000 })
    .then(() => true, () => false);
  await page.click('#console-full');
  await page.waitForFunction(() => !document.fullscreenElement, null, { timeout: 10000 });

  // Ctrl-Alt-Del: the guest's BIOS restarts it; the Go test sees it start
  // again on the serial line.
  await b.control('watch-serial');
  await page.click('#console-cad');
  await b.control('await-reboot');

  // The serial console: a typed line reaches the guest, its answer shows.
  await page.click('#console-close');
  await page.click(`${replica} button.replica-serial`);
  await page.waitForSelector('#console[data-state="open"][data-kind="serial"]', { timeout: 30000 });
  await typeLine(page, 'hello page');
  report.serial = await serialText(page);
  await b.shot(page, 'machines-serial.png', { selector: '#console' });

  // The machine's side ends: the page says so; Reconnect opens it again.
  await b.control('hangup');
  report.hangup = await closedWith(page);
  b.log('hangup:', report.hangup);
  await page.click('#console-reconnect');
  await page.waitForSelector('#console[data-state="open"][data-kind="serial"]', { timeout: 30000 });
  await typeLine(page, 'again');
  report.again = await serialText(page);
  await ctx.close();
  return report;
});

// Scenario: the buyer stops, starts and restarts the machines of a running
// order from their card: Stop on one replica, Stop all (one replica
// stopped already: said in words), Start all, Restart of one, and a stop
// the cluster does not take (said in words after the page's retries).
// The Go test waits, between the steps, until the edge's status shows
// what the cluster did.
// Env: PAGE_ORDER (an active order of two running replicas), PAGE_VM0,
// PAGE_VM1 (their names).
import * as b from './lib.mjs';

b.main(async (track) => {
  const order = b.env('PAGE_ORDER');
  const vm0 = b.env('PAGE_VM0');
  const vm1 = b.env('PAGE_VM1');
  const card = `#machine-list li[data-order-id="${order}"]`;
  const replica = (vm) => `${card} li.replica[data-replica="${vm}"]`;
  const ctx = await b.launch();
  const page = await b.firstPage(ctx);
  track(page);
  await b.signIn(page);
  await page.waitForSelector(`${replica(vm1)}[data-state="running"]`, { timeout: 20000 });
  const buttons = (vm) => page.evaluate((sel) => Array.from(document.querySelectorAll(`${sel} .replica-power button`),
    (x) => x.textContent.trim()), replica(vm));
  const orderButtons = () => page.evaluate((sel) => Array.from(document.querySelectorAll(`${sel} .order-power button`),
    (x) => x.textContent.trim()), card);
  // press clicks a button and waits for the page's message about it.
  const press = async (sel) => {
    await page.evaluate(() => { document.getElementById('message').textContent = ''; });
    await page.locator(sel).click();
    await page.waitForFunction(() => document.getElementById('message').textContent.trim() !== '' &&
      !document.body.dataset.loading, null, { timeout: 30000, polling: 100 });
    return b.message(page);
  };
  // settled refreshes once the edge shows the states wanted (the Go test
  // waits for them) and waits for the page to show them.
  const settled = async (name, states) => {
    await b.control(name);
    await page.locator('#refresh').click();
    await page.waitForFunction(([sels, states]) => sels.every((s, i) => document.querySelector(s)?.dataset.state === states[i]),
      [[replica(vm0), replica(vm1)], states], { timeout: 20000, polling: 100 });
  };
  const running = { vm0: await buttons(vm0), vm1: await buttons(vm1), order: await orderButtons() };

  const stopOne = await press(`${replica(vm1)} button.replica-stop`);
  await settled('oneStopped', ['running', 'stopped']);
  const oneStopped = { vm0: await buttons(vm0), vm1: await buttons(vm1) };
  const stopAll = await press(`${card} button.order-stop`);
  await settled('allStopped', ['stopped', 'stopped']);
  const startAll = await press(`${card} button.order-start`);
  await settled('allRunning', ['running', 'running']);
  const restart = await press(`${replica(vm0)} button.replica-restart`);
  await b.control('breakCluster');
  const refused = await press(`${replica(vm0)} button.replica-stop`);
  await ctx.close();
  return { running, stopOne, oneStopped, stopAll, startAll, restart, refused };
});

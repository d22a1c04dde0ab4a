// Shared by the scenario scripts of cmd/vmshelf's TestPage* tests: launch
// Debian's Chromium through playwright-core, sign in on /machines, watch the
// upload rows, talk to the Go test's control server, report.
//
// Everything the script needs comes from the environment (never the command
// line, which other users of the machine can read): PAGE_URL (the
// /machines URL), PAGE_TOKEN (the tenant token), PAGE_CONTROL (the Go
// test's loopback control server), PAGE_PROFILE (a fresh user-data dir),
// PAGE_CHROMIUM (the browser), PAGE_SHOTS (where screenshots go; unset: none)
// and per scenario PAGE_FILE… paths.
//
// Every wait is bounded; a script that fails throws, which prints the
// error and the page's upload list on stderr and exits 1. The last line on
// stdout is the scenario's report as JSON, which the Go test checks.

import { chromium } from 'playwright-core';
import path from 'node:path';

export function env(name) {
  const v = process.env[name];
  if (!v) throw new Error(`${name} is not set`);
  return v;
}

const t0 = Date.now();
export function log(...args) {
  console.error(`[${((Date.now() - t0) / 1000).toFixed(2)}s]`, ...args);
}

// What happened in the page, across reloads and browser restarts: every
// change of an upload row's state, bar and flags, and every announcement of
// the live region, in order.
export const events = [];
// Uncaught exceptions and CSP violations: always a bug of the page.
export const pageErrors = [];

export const desktop = { width: 1280, height: 900 };
export const phone = { width: 390, height: 844 };

// The recorder runs in the page before its own scripts (an init script is
// not subject to the page's CSP). It reports through a binding, so that
// what it saw survives a reload.
const recorder = () => {
  const seen = new Map();
  // One scan sees what one task of the page changed: its changes happened
  // together (a row ending and the next starting), whatever the order the
  // scan reports them in.
  let batch = 0;
  const snap = (li) => {
    const bar = li.querySelector('progress.upload-bar');
    return {
      file: li.dataset.file,
      state: li.dataset.state || '',
      reason: li.dataset.reason || '',
      resumed: li.dataset.resumed === 'true',
      uploadId: li.dataset.uploadId || '',
      value: bar ? Number(bar.value) : -1,
      status: (li.querySelector('.upload-status')?.textContent || '').trim(),
    };
  };
  const scan = () => {
    batch++;
    for (const li of document.querySelectorAll('li.upload[data-file]')) {
      const s = snap(li);
      const key = JSON.stringify(s);
      if (seen.get(li) !== key) {
        seen.set(li, key);
        window.__vmshelfRecord({ kind: 'row', batch, ...s });
      }
    }
    const live = document.getElementById('upload-live');
    if (live) {
      const text = live.textContent.trim();
      if (text && text !== seen.get(live)) {
        seen.set(live, text);
        window.__vmshelfRecord({ kind: 'live', text });
      }
    }
  };
  new MutationObserver(scan).observe(document, {
    subtree: true, childList: true, characterData: true, attributes: true,
    attributeFilter: ['data-state', 'data-reason', 'data-resumed', 'data-upload-id', 'value'],
  });
};

// A zone far from UTC, for scenarios that check the page shows times in
// UTC whatever the browser's zone.
export const farZone = 'America/Los_Angeles';

// launch starts Chromium on the profile dir (the same dir again is a
// browser restart with the same localStorage); more are more of
// playwright's context options (timezoneId).
export async function launch(profile = env('PAGE_PROFILE'), viewport = desktop, more = {}) {
  const ctx = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.PAGE_CHROMIUM || '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu'],
    viewport,
    timeout: 30000,
    ...more,
  });
  ctx.setDefaultTimeout(20000);
  await ctx.exposeBinding('__vmshelfRecord', (_src, ev) => {
    events.push({ at: Date.now() - t0, ...ev });
  });
  await ctx.addInitScript(recorder);
  ctx.on('page', watchPage);
  for (const p of ctx.pages()) watchPage(p);
  return ctx;
}

function watchPage(page) {
  page.on('pageerror', (e) => {
    pageErrors.push(`uncaught: ${e.message}`);
    log('page error:', e.message);
  });
  page.on('console', (m) => {
    if (m.type() !== 'error' && m.type() !== 'warning') return;
    const text = m.text();
    log(`console.${m.type()}:`, text);
    if (/Content Security Policy/i.test(text)) pageErrors.push(`CSP: ${text}`);
  });
}

// page is the context's first page (a persistent context opens one).
export async function firstPage(ctx) {
  return ctx.pages()[0] || ctx.newPage();
}

// signIn opens /machines, pastes the token and waits until the first status
// is rendered.
export async function signIn(page, token = env('PAGE_TOKEN')) {
  await open(page);
  await page.locator('#token').fill(token);
  await page.locator('#token-save').click();
  await ready(page);
}

// open loads /machines and waits until its modules have wired its
// forms (a press before that does nothing); anything but 200 fails at once.
export async function open(page) {
  const resp = await page.goto(env('PAGE_URL'));
  if (!resp || resp.status() !== 200) throw new Error(`GET ${env('PAGE_URL')}: ${resp ? resp.status() : 'no answer'}`);
  await page.waitForSelector('body[data-wired="true"]', { timeout: 20000 });
}

// ready waits for body[data-ready="true"] and fails at once on #message.
export async function ready(page) {
  await page.waitForSelector('body[data-ready="true"]', { timeout: 20000 });
}

// rowSel is the selector of a file's upload row.
export const rowSel = (file) => `li.upload[data-file=${JSON.stringify(file)}]`;

// choose sets the file input to paths and presses Start.
export async function choose(page, paths, { efi = false } = {}) {
  await page.locator('#upload-file').setInputFiles(paths);
  if (efi) await page.locator('#upload-efi').check();
  await page.locator('#upload-start').click();
}

// row reads a file's upload row (null when there is none).
export async function row(page, file) {
  return page.evaluate((sel) => {
    const li = document.querySelector(sel);
    if (!li) return null;
    const bar = li.querySelector('progress.upload-bar');
    const text = (c) => (li.querySelector(c)?.textContent || '').trim();
    return {
      file: li.dataset.file, state: li.dataset.state || '', reason: li.dataset.reason || '',
      resumed: li.dataset.resumed === 'true', uploadId: li.dataset.uploadId || '',
      value: bar ? Number(bar.value) : -1, max: bar ? Number(bar.max) : -1,
      percent: text('.upload-percent'), speed: text('.upload-speed'), eta: text('.upload-eta'),
      status: text('.upload-status'),
    };
  }, rowSel(file));
}

// untilState waits (bounded) until a file's row is in one of states and
// returns it; an end state other than the wanted ones fails at once.
export async function untilState(page, file, states, timeout = 60000) {
  const ends = ['done', 'refused', 'cancelled'];
  const want = Array.isArray(states) ? states : [states];
  const stop = [...new Set([...want, ...ends])];
  try {
    await page.waitForFunction(
      ([sel, stop]) => {
        const li = document.querySelector(sel);
        return li && stop.includes(li.dataset.state);
      },
      [rowSel(file), stop],
      { timeout, polling: 100 },
    );
  } catch (e) {
    throw new Error(`${file}: no state ${stop.join('|')} within ${timeout} ms; row: ${JSON.stringify(await row(page, file))}`);
  }
  const r = await row(page, file);
  if (!want.includes(r.state)) {
    throw new Error(`${file}: ended ${r.state} (${r.reason}: ${r.status}), want ${want.join('|')}; #message: ${await message(page)}`);
  }
  return r;
}

// untilProgress waits until a file's bar shows at least pct (and the row is
// still uploading).
export async function untilProgress(page, file, pct, timeout = 60000) {
  try {
    await page.waitForFunction(
      ([sel, pct]) => {
        const li = document.querySelector(sel);
        const bar = li?.querySelector('progress.upload-bar');
        if (li && ['done', 'refused', 'cancelled'].includes(li.dataset.state)) return true;
        return bar && Number(bar.value) >= pct;
      },
      [rowSel(file), pct],
      { timeout, polling: 50 },
    );
  } catch (e) {
    throw new Error(`${file}: the bar did not reach ${pct} % within ${timeout} ms; row: ${JSON.stringify(await row(page, file))}`);
  }
  const r = await row(page, file);
  if (r.state !== 'uploading' && r.state !== 'retrying') {
    throw new Error(`${file}: wanted it uploading at ${pct} %, it is ${r.state} (${r.reason}: ${r.status})`);
  }
  return r;
}

// untilSession waits for the row of an unfinished session (from
// status.sessions) and returns its state and words.
export async function untilSession(page, uploadId, timeout = 20000) {
  if (!uploadId) throw new Error('the upload row had no data-upload-id before the interruption');
  const sel = `li.upload[data-upload-id=${JSON.stringify(uploadId)}]`;
  try {
    await page.waitForSelector(sel, { timeout });
  } catch (e) {
    throw new Error(`no row for the unfinished session ${uploadId} within ${timeout} ms; #upload-list: ${await page.evaluate(() => document.getElementById('upload-list')?.outerHTML)}`);
  }
  return page.evaluate((sel) => {
    const li = document.querySelector(sel);
    return {
      state: li.dataset.state || '', file: li.dataset.file || '', text: li.textContent.replace(/\s+/g, ' ').trim(),
      word: (li.querySelector('.upload-state')?.textContent || '').trim(),
    };
  }, sel);
}

// layout reads where the page's parts are: each section's top (px from
// the top of the document, null when not shown), the page's height and
// the viewport's, the catalogue's cards and the not-offered list.
export async function layout(page) {
  return page.evaluate(() => {
    const top = (id) => {
      const e = document.getElementById(id);
      if (!e) return null;
      const r = e.getBoundingClientRect();
      return r.height > 0 ? Math.round(r.top + window.scrollY) : null;
    };
    const cards = [...document.querySelectorAll('#catalogue-list > li')].map((li) => {
      const r = li.getBoundingClientRect();
      const last = li.lastElementChild?.getBoundingClientRect();
      return { top: Math.round(r.top), left: Math.round(r.left), height: Math.round(r.height), lastBottom: last ? Math.round(r.bottom - last.bottom) : -1 };
    });
    const box = document.querySelector('#not-offered-box');
    const item = document.querySelector('#not-offered li');
    return {
      tops: Object.fromEntries(['machines', 'listings', 'images', 'offers', 'order', 'catalogue'].map((id) => [id, top(id)])),
      height: document.documentElement.scrollHeight, viewport: window.innerHeight,
      cards,
      notOffered: {
        details: box ? box.tagName.toLowerCase() : '', open: !!(box && box.open),
        summary: (box?.querySelector('summary')?.textContent || '').replace(/\s+/g, ' ').trim(),
        items: document.querySelectorAll('#not-offered li').length,
        itemShown: !!(item && item.checkVisibility()),
      },
    };
  });
}

// tabTo presses Tab until the element matching sel has the focus
// (bounded), from where the focus is.
export async function tabTo(page, sel, max = 30) {
  for (let i = 0; i < max; i++) {
    await page.keyboard.press('Tab');
    if (await page.evaluate((sel) => document.activeElement === document.querySelector(sel), sel)) return i + 1;
  }
  throw new Error(`${max} presses of Tab did not reach ${sel}; the focus is on ${await page.evaluate(() => document.activeElement?.outerHTML.slice(0, 120))}`);
}

export async function message(page) {
  return page.evaluate(() => (document.getElementById('message')?.textContent || '').trim());
}

// images reads #image-list and #image-quota.
export async function images(page) {
  return page.evaluate(() => {
    const q = document.getElementById('image-quota');
    return {
      quota: q ? { text: q.textContent.trim(), used: q.dataset.used, limit: q.dataset.limit } : null,
      list: [...document.querySelectorAll('#image-list li[data-upload-id]')].map((li) => ({
        uploadId: li.dataset.uploadId,
        name: (li.querySelector('.image-name')?.textContent || '').trim(),
        sha256: (li.querySelector('.image-sha256')?.textContent || '').trim(),
        size: (li.querySelector('.image-size')?.textContent || '').trim(),
        removeButton: !!li.querySelector('button.image-remove'),
        boot: (li.querySelector('.image-boot')?.textContent || '').trim(),
      })),
    };
  });
}

// untilImages waits until #image-list has n images.
export async function untilImages(page, n, timeout = 20000) {
  await page.waitForFunction((n) => document.querySelectorAll('#image-list li[data-upload-id]').length >= n, n, { timeout, polling: 100 });
  return images(page);
}

// storage reads what the page keeps: sessionStorage and localStorage keys
// and values.
export async function storage(page) {
  return page.evaluate(() => {
    const dump = (s) => Object.fromEntries([...Array(s.length).keys()].map((i) => [s.key(i), s.getItem(s.key(i))]));
    return { session: dump(sessionStorage), local: dump(localStorage) };
  });
}

// control asks the Go test to do something (restart serve, pay a session,
// check a metric) and returns its JSON answer.
export async function control(name, body = {}) {
  log('control:', name);
  const r = await fetch(`${env('PAGE_CONTROL')}/${name}`, {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
    signal: AbortSignal.timeout(60000),
  });
  const text = await r.text();
  if (!r.ok) throw new Error(`control ${name}: ${r.status} ${text}`);
  return text ? JSON.parse(text) : {};
}

// shot writes a screenshot into PAGE_SHOTS when it is set (the Go test sets
// it only under VMSHELF_SCREENSHOTS=1, so normal runs never rewrite docs).
// What is shot: the viewport (the top of the page), or with selector that
// element alone (the full page is long: the catalogue lists every system).
// scrollTo: an element to scroll to the top of a viewport shot (default:
// the top of the page).
export async function shot(page, name, { selector, scrollTo, before } = {}) {
  const dir = process.env.PAGE_SHOTS;
  if (!dir) return;
  if (before) await before();
  if (!selector) {
    await page.evaluate((sel) => {
      const el = sel && document.querySelector(sel);
      if (el) el.scrollIntoView({ block: 'start' });
      else window.scrollTo(0, 0);
    }, scrollTo || null);
  }
  const file = path.join(dir, name);
  const opts = { path: file, animations: 'disabled', caret: 'hide' };
  if (selector) await page.locator(selector).screenshot(opts);
  else await page.screenshot(opts);
  log('screenshot', file);
}

// main runs a scenario: its report is the last stdout line; a failure
// prints what the page showed.
export async function main(scenario) {
  let page = null;
  const track = (p) => { page = p; };
  try {
    const report = await scenario(track);
    report.events = events;
    report.pageErrors = pageErrors;
    process.stdout.write(JSON.stringify(report) + '\n');
    process.exit(0);
  } catch (e) {
    log('FAILED:', e?.stack || e);
    if (page && !page.isClosed()) {
      try {
        log('#message:', await message(page));
        log('#upload-list:', await page.evaluate(() => document.getElementById('upload-list')?.outerHTML || '(none)'));
      } catch (e2) {
        log('could not read the page:', e2.message);
      }
    }
    log('events:', JSON.stringify(events));
    process.exit(1);
  }
}

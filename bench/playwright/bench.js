// Playwright timings against the same Debian Chromium and the same pages
// (browser/testdata) the browser package's benchmarks use, for the
// comparison in docs/benchmarks.md. Not part of CI.
//
//   cd bench/playwright && npm install && node bench.js [runs]
//
// Prints one line per operation: median and p90 in ms over `runs`
// (default 30) after 3 warm-up runs.
'use strict';

const http = require('http');
const fs = require('fs');
const path = require('path');
const { chromium } = require('playwright-core');

const RUNS = Number(process.argv[2]) || 30;
const WARM = 3;
const TESTDATA = path.join(__dirname, '..', '..', 'browser', 'testdata');

function serve() {
  const srv = http.createServer((req, res) => {
    const name = path.basename(new URL(req.url, 'http://x').pathname) || 'basic.html';
    fs.readFile(path.join(TESTDATA, name), (err, data) => {
      if (err) {
        res.writeHead(404);
        res.end();
        return;
      }
      res.writeHead(200, { 'Content-Type': 'text/html; charset=utf-8' });
      res.end(data);
    });
  });
  return new Promise((resolve) => srv.listen(0, '127.0.0.1', () => resolve(srv)));
}

async function time(name, fn) {
  for (let i = 0; i < WARM; i++) await fn();
  const d = [];
  for (let i = 0; i < RUNS; i++) {
    const t0 = process.hrtime.bigint();
    await fn();
    d.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  d.sort((a, b) => a - b);
  const at = (p) => d[Math.floor(p * (d.length - 1))];
  console.log(`${name.padEnd(24)} median ${at(0.5).toFixed(2).padStart(8)} ms   p90 ${at(0.9).toFixed(2).padStart(8)} ms`);
}

// The binary a headless browser sandbox runs (internal/chromium): Debian's
// headless shell when installed, as Playwright itself runs one for headless
// pages; else the whole browser.
function defaultChromium() {
  const shell = '/usr/lib/chromium/chromium-headless-shell';
  return require('fs').existsSync(shell) ? shell : '/usr/bin/chromium';
}

async function main() {
  const srv = await serve();
  const base = `http://127.0.0.1:${srv.address().port}`;
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM || defaultChromium(),
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-background-networking',
      '--disable-component-update', '--no-first-run', '--disable-sync'],
  });
  // The browser package's default viewport.
  const ctx = await browser.newContext({ viewport: { width: 1280, height: 720 } });
  const page = await ctx.newPage();
  console.log(`playwright-core ${require('playwright-core/package.json').version}, ${browser.version()}, ${RUNS} runs`);

  await page.goto(base + '/form.html');
  await time('screenshot jpeg', () => page.screenshot({ type: 'jpeg' }));
  await time('screenshot png', () => page.screenshot({ type: 'png' }));
  await time('click (mouse at x,y)', () => page.mouse.click(10, 400));
  await time('click (locator)', () => page.click('#name'));
  const text = 'a'.repeat(50);
  await time('type50 keyboard.type', async () => {
    await page.fill('#name', '');
    await page.locator('#name').focus();
    await page.keyboard.type(text);
  });
  await time('type50 fill', () => page.fill('#name', text));
  await time('aria snapshot', () => page.locator('body').ariaSnapshot());
  await time('navigate (load)', () => page.goto(base + '/basic.html'));

  await browser.close();
  srv.close();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});

// The baseline of BenchmarkBrowserVsPlaywright: one Playwright browser (the
// same Chromium binary, CHROMIUM) shows the benchmark's page (PAGE_FILE) at
// 1280×720 and, for each line `op count` read from stdin, runs op count
// times and prints {"ms": [...]} (one duration each) as a line of JSON:
//
//   screenshot   page.screenshot({type: 'jpeg', quality: 80})
//   step-change  mouse.click at CHANGE_X,CHANGE_Y (the DOM changes), then
//                the same screenshot
//   step-still   mouse.click at STILL_X,STILL_Y (nothing changes), then
//                the same screenshot
//
// It prints {"ready": true} once the page is shown.
const fs = require('fs');
const readline = require('readline');
const { chromium } = require('playwright-core');

(async () => {
  const html = fs.readFileSync(process.env.PAGE_FILE, 'utf8');
  const browser = await chromium.launch({ executablePath: process.env.CHROMIUM, headless: true, args: ['--no-sandbox'] });
  const page = await browser.newPage({ viewport: { width: 1280, height: 720 } });
  await page.setContent(html);
  const shot = () => page.screenshot({ type: 'jpeg', quality: 80 });
  const at = (x, y) => [Number(process.env[x]), Number(process.env[y])];
  const [cx, cy] = at('CHANGE_X', 'CHANGE_Y');
  const [sx, sy] = at('STILL_X', 'STILL_Y');
  const ops = {
    'screenshot': shot,
    'step-change': async () => { await page.mouse.click(cx, cy); await shot(); },
    'step-still': async () => { await page.mouse.click(sx, sy); await shot(); },
  };
  console.log(JSON.stringify({ ready: true }));
  const rl = readline.createInterface({ input: process.stdin });
  for await (const line of rl) {
    const [op, count] = line.trim().split(/\s+/);
    if (!ops[op]) throw new Error('unknown op ' + op);
    const ms = [];
    for (let i = 0; i < Number(count); i++) {
      const t0 = process.hrtime.bigint();
      await ops[op]();
      ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
    console.log(JSON.stringify({ ms }));
  }
  await browser.close();
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});

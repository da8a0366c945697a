// Attaches to a browser sandbox through Orchard's DevTools proxy with
// Playwright's connectOverCDP, drives the sandbox's own tab and prints what
// it saw as JSON. Input: CDP_URL (ws://.../browser/cdp) and CDP_KEY.
const { chromium } = require('playwright-core');

(async () => {
  const browser = await chromium.connectOverCDP(process.env.CDP_URL, {
    headers: { 'X-API-Key': process.env.CDP_KEY },
    timeout: 30000,
  });
  const pages = browser.contexts().flatMap((c) => c.pages());
  const page = pages.find((p) => p.url() === 'file:///workspace/page.html');
  if (!page) throw new Error('no tab shows the page; tabs: ' + pages.map((p) => p.url()).join(', '));
  const title = await page.title();
  await page.click('#b');
  const out = await page.textContent('#out');
  const shot = await page.screenshot({ type: 'png' });
  const png = shot.subarray(1, 4).toString() === 'PNG';
  // Disconnects; a browser Playwright did not launch stays up.
  await browser.close();
  console.log(JSON.stringify({ title, out, png, bytes: shot.length }));
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});

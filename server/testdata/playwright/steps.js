// The baseline of BenchmarkBrowserConcurrent: BROWSERS Playwright browsers
// (the same Chromium binary, CHROMIUM, each launched as Playwright launches
// one) each show the benchmark's page (PAGE_FILE, at 800×600) and click at
// (CLICK_X, CLICK_Y) then take a JPEG screenshot at quality 80, back to
// back, for SECONDS. Prints {"steps", "seconds", "p50_ms", "p90_ms",
// "cpu_s"} as JSON; cpu_s is the CPU time the whole machine spent busy
// while they stepped (/proc/stat).
const fs = require('fs');
const { chromium } = require('playwright-core');

// machineCPU is the seconds every core has spent busy since boot: the
// first line of /proc/stat but idle and iowait, in USER_HZ (100) ticks.
function machineCPU() {
  const f = fs.readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/);
  const t = f.slice(1, 9).map(Number);
  return (t[0] + t[1] + t[2] + t[5] + t[6] + t[7]) / 100;
}

(async () => {
  const n = Number(process.env.BROWSERS || 16);
  const seconds = Number(process.env.SECONDS || 20);
  const x = Number(process.env.CLICK_X || 200);
  const y = Number(process.env.CLICK_Y || 140);
  const html = fs.readFileSync(process.env.PAGE_FILE, 'utf8');
  // Launched four at a time, as the benchmark creates its sandboxes.
  const browsers = [];
  const pages = [];
  for (let i = 0; i < n; i += 4) {
    const batch = await Promise.all(
      Array.from({ length: Math.min(4, n - i) }, () =>
        chromium.launch({ executablePath: process.env.CHROMIUM, headless: true, args: ['--no-sandbox'] })));
    browsers.push(...batch);
  }
  for (const b of browsers) {
    const page = await b.newPage({ viewport: { width: 800, height: 600 } });
    await page.setContent(html);
    await page.mouse.click(x, y); // warm, as the benchmark warms each tab
    await page.screenshot({ type: 'jpeg', quality: 80 });
    pages.push(page);
  }
  const lat = [];
  const cpu0 = machineCPU();
  const start = process.hrtime.bigint();
  const deadline = start + BigInt(seconds * 1e9);
  await Promise.all(pages.map(async (page) => {
    while (process.hrtime.bigint() < deadline) {
      const t0 = process.hrtime.bigint();
      await page.mouse.click(x, y);
      await page.screenshot({ type: 'jpeg', quality: 80 });
      lat.push(Number(process.hrtime.bigint() - t0) / 1e6);
    }
  }));
  const elapsed = Number(process.hrtime.bigint() - start) / 1e9;
  const cpu = machineCPU() - cpu0;
  await Promise.all(browsers.map((b) => b.close()));
  lat.sort((a, b) => a - b);
  const at = (p) => lat[Math.floor(p * (lat.length - 1))];
  console.log(JSON.stringify({ steps: lat.length, seconds: elapsed, p50_ms: at(0.5), p90_ms: at(0.9), cpu_s: cpu }));
})().catch((e) => {
  console.error(e && e.stack ? e.stack : String(e));
  process.exit(1);
});

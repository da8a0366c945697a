// Paces requestAnimationFrame to 60 Hz in a browser started with
// --disable-frame-rate-limit (Options.FastFrames). Without a frame clock
// Chromium produces a frame as soon as the last is done, so a page that
// animates with requestAnimationFrame would redraw as fast as the CPU
// allows; this wrapper gives it the cadence it has in a normal browser,
// while a screenshot no longer waits for the next tick of a 60 Hz clock.
(() => {
  const w = window;
  if (w.__orchardPacer) return;
  Object.defineProperty(w, "__orchardPacer", { value: true });
  const nativeRAF = w.requestAnimationFrame, nativeCAF = w.cancelAnimationFrame;
  const period = 1000 / 60;
  let nextID = 1, pending = new Map(), armed = false, last = -Infinity, timer = 0, raf = 0;
  const run = (ts) => {
    armed = false;
    raf = 0;
    last = performance.now();
    const due = pending;
    pending = new Map();
    for (const cb of due.values()) {
      try {
        cb(ts);
      } catch (e) {
        // As a native callback's exception: reported, the others still run.
        setTimeout(() => { throw e; });
      }
    }
  };
  const arm = () => {
    if (armed) return;
    armed = true;
    const wait = last + period - performance.now();
    if (wait <= 0) {
      raf = nativeRAF.call(w, run);
    } else {
      timer = setTimeout(() => { timer = 0; raf = nativeRAF.call(w, run); }, wait);
    }
  };
  const wrapped = {
    requestAnimationFrame(cb) {
      if (typeof cb !== "function") return nativeRAF.call(w, cb); // native TypeError
      const id = nextID++;
      pending.set(id, cb);
      arm();
      return id;
    },
    cancelAnimationFrame(id) {
      pending.delete(id);
      if (pending.size === 0 && armed) {
        if (timer) clearTimeout(timer);
        if (raf) nativeCAF.call(w, raf);
        timer = raf = 0;
        armed = false;
      }
    },
  };
  w.requestAnimationFrame = wrapped.requestAnimationFrame;
  w.cancelAnimationFrame = wrapped.cancelAnimationFrame;
})();

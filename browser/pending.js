// Keeps count of the work a document has scheduled for the next moments —
// timers, animation-frame callbacks, a navigation it started — so that the
// wait after an action can end as soon as nothing is left to run, instead
// of always waiting out the idle window. Installed in every document before
// its own scripts. The page can see it: setTimeout, clearTimeout,
// requestAnimationFrame and cancelAnimationFrame are wrappers (their names
// and lengths are the native ones, their source text is not), and the
// navigation API has three listeners more. Options.PlainSettle leaves pages
// untouched.
(() => {
  const w = window, key = Symbol.for("orchard.pending");
  if (Object.prototype.hasOwnProperty.call(w, key)) return;
  // Captured now: a page that replaces these later must not break the
  // wrappers, nor see its replacements called by them.
  const apply = Reflect.apply, slice = Array.prototype.slice;
  const perf = w.performance, perfNow = perf.now;
  const now = () => apply(perfNow, perf, []);
  const nativeST = w.setTimeout, nativeCT = w.clearTimeout;
  const nativeRAF = w.requestAnimationFrame, nativeCAF = w.cancelAnimationFrame;
  // id → when the timer is due, and id → when the frame callback was asked
  // for. Entries whose moment is over a second past are dropped when
  // counted: a timer cleared through clearInterval, or a frame that a
  // hidden page never draws, must not keep the page "busy" for ever.
  const timers = new Map(), frames = new Map();
  const stale = 1000;
  let navAt = -Infinity;

  // A timer's delay as the browser reads it (WebIDL long: not finite or
  // beyond 2^31-1 is 0), or -1 when reading it could run page code.
  const delayOf = (d) => {
    if (d === undefined) return 0;
    if (typeof d === "string") d = Number(d);
    else if (typeof d !== "number") return -1;
    return Number.isFinite(d) && d > 0 && d <= 2147483647 ? d : 0;
  };

  const wrapped = {
    setTimeout(handler) {
      const delay = delayOf(arguments[1]);
      if (typeof handler !== "function" || delay < 0) return apply(nativeST, this, arguments);
      const args = apply(slice, arguments, []);
      let id;
      args[0] = function () {
        timers.delete(id);
        return apply(handler, this, arguments);
      };
      id = apply(nativeST, this, args);
      timers.set(id, now() + delay);
      return id;
    },
    clearTimeout() {
      timers.delete(arguments[0]);
      return apply(nativeCT, this, arguments);
    },
    requestAnimationFrame(callback) {
      if (typeof callback !== "function") return apply(nativeRAF, this, arguments);
      let id;
      id = apply(nativeRAF, this, [function () {
        frames.delete(id);
        return apply(callback, this, arguments);
      }]);
      frames.set(id, now());
      return id;
    },
    cancelAnimationFrame(id) {
      frames.delete(id);
      return apply(nativeCAF, this, arguments);
    },
  };
  w.setTimeout = wrapped.setTimeout;
  w.clearTimeout = wrapped.clearTimeout;
  if (typeof nativeRAF === "function") {
    w.requestAnimationFrame = wrapped.requestAnimationFrame;
    w.cancelAnimationFrame = wrapped.cancelAnimationFrame;
  }

  // A navigation the document started (a link, a form, location.href set
  // by a handler) may not have reached the browser yet when the wait
  // looks: it counts as pending work until it ends in this document (a
  // same-document one) or the document goes (a cross-document one).
  const nav = w.navigation;
  if (nav && typeof nav.addEventListener === "function") {
    nav.addEventListener("navigate", (e) => {
      if (!e.downloadRequest) navAt = now();
    });
    const over = () => { navAt = -Infinity; };
    nav.addEventListener("navigatesuccess", over);
    nav.addEventListener("navigateerror", over);
  }

  // pending(within) counts timers due within `within` ms, frame callbacks
  // not yet run, and a navigation under way.
  const pending = (within) => {
    const t = now();
    let n = 0;
    for (const [id, due] of timers) {
      if (due < t - stale) timers.delete(id);
      else if (due <= t + within) n++;
    }
    for (const [id, at] of frames) {
      if (at < t - stale) frames.delete(id);
      else n++;
    }
    if (t - navAt < stale) n++;
    return n;
  };
  Object.defineProperty(w, key, {
    value: Object.freeze({ pending, setTimeout: nativeST, requestAnimationFrame: nativeRAF }),
  });
})();

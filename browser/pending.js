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
  const nativeST = w.setTimeout, nativeCT = w.clearTimeout, nativeSI = w.setInterval;
  const nativeRAF = w.requestAnimationFrame, nativeCAF = w.cancelAnimationFrame;
  // id → when the timer is due, and id → when the frame callback was asked
  // for. Entries whose moment is over a second past are dropped when
  // counted: a timer cleared through clearInterval, or a frame that a
  // hidden page never draws, must not keep the page "busy" for ever.
  const timers = new Map(), frames = new Map();
  const stale = 1000;
  let navAt = -Infinity;
  // changed is when the document last changed in a way that could show
  // (wall-clock ms, comparable across documents): a DOM mutation, a timer
  // or frame callback run, a scroll, an edit, a resource loaded. A frame
  // captured after that moment, with no change since, still shows the
  // page (browser/reuse.go).
  const origin = perf.timeOrigin;
  let changed = origin + now();
  const mark = () => { changed = origin + now(); };

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
        mark();
        return apply(handler, this, arguments);
      };
      id = apply(nativeST, this, args);
      timers.set(id, now() + delay);
      return id;
    },
    // An interval is never pending (a poll would keep the page busy for
    // ever), but each run is a change.
    setInterval(handler) {
      if (typeof handler !== "function") return apply(nativeSI, this, arguments);
      const args = apply(slice, arguments, []);
      args[0] = function () {
        mark();
        return apply(handler, this, arguments);
      };
      return apply(nativeSI, this, args);
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
        mark();
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
  w.setInterval = wrapped.setInterval;
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

  // Changes made without a wrapped callback: the page's own event
  // handlers, network callbacks, what input does without script.
  try {
    new MutationObserver(mark).observe(w.document, { subtree: true, childList: true, attributes: true, characterData: true });
  } catch (e) { /* a document without a root yet observes nothing: live() says unknown */ }
  for (const type of ["scroll", "input", "change", "load", "error", "resize", "focusin", "focusout", "message", "hashchange", "popstate", "pageshow"]) {
    w.addEventListener(type, mark, { capture: true, passive: true });
  }
  if (w.document.fonts && typeof w.document.fonts.addEventListener === "function") {
    w.document.fonts.addEventListener("loadingdone", mark);
  }

  // live reports what draws without the document changing: animations
  // and transitions running, a video playing, a caret blinking in a
  // focused field, fonts still loading.
  const live = () => {
    const d = w.document;
    const a = d.activeElement;
    if (a && (a.isContentEditable || a.tagName === "INPUT" || a.tagName === "TEXTAREA")) return true;
    if (d.fonts && d.fonts.status === "loading") return true;
    if (typeof d.getAnimations === "function") {
      for (const an of d.getAnimations()) if (an.playState === "running" || an.pending) return true;
    }
    for (const m of d.getElementsByTagName("video")) if (!m.paused && !m.ended) return true;
    return false;
  };

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
    value: Object.freeze({ pending, live, changed: () => changed, setTimeout: nativeST, requestAnimationFrame: nativeRAF }),
  });
})();

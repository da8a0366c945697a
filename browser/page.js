// The in-page half of the browser package: one object per document,
// installed on first use under a symbol on window. It finds the
// interactive elements (set-of-marks), writes the compact accessibility
// tree and locates elements for actions, each in a single evaluation.
(function () {
  'use strict';
  var INTERACTIVE = {
    button: 1, link: 1, checkbox: 1, radio: 1, 'switch': 1, tab: 1, menuitem: 1,
    menuitemcheckbox: 1, menuitemradio: 1, option: 1, combobox: 1, textbox: 1,
    searchbox: 1, slider: 1, spinbutton: 1, treeitem: 1, listbox: 1, gridcell: 0
  };
  var LANDMARK = {
    main: 1, navigation: 1, banner: 1, contentinfo: 1, complementary: 1, search: 1,
    form: 1, region: 1, dialog: 1, alertdialog: 1, alert: 1, status: 1
  };
  // Roles whose accessible name is their text: their text is not repeated
  // as separate text lines.
  var NAME_FROM_CONTENT = {
    button: 1, link: 1, heading: 1, tab: 1, menuitem: 1, menuitemcheckbox: 1,
    menuitemradio: 1, option: 1, treeitem: 1, checkbox: 1, radio: 1, 'switch': 1,
    cell: 1, columnheader: 1, rowheader: 1, gridcell: 1, tooltip: 1
  };
  var SKIP = { SCRIPT: 1, STYLE: 1, NOSCRIPT: 1, TEMPLATE: 1, HEAD: 1, META: 1, LINK: 1, TITLE: 1 };
  var MAX_MARKS = 5000, MAX_LINES = 3000, MAX_LINE = 300, MAX_NAME = 100, MAX_NODES = 200000;

  var marks = [];
  var observed = false;

  function clean(s, max) {
    s = String(s == null ? '' : s).replace(/\s+/g, ' ').trim();
    max = max || MAX_NAME;
    return s.length > max ? s.slice(0, max - 1) + '…' : s;
  }

  function implicitRole(el) {
    var tag = el.tagName, t;
    switch (tag) {
      case 'A': case 'AREA': return el.hasAttribute('href') ? 'link' : '';
      case 'BUTTON': return 'button';
      case 'SUMMARY': return 'button';
      case 'SELECT': return (el.multiple || el.size > 1) ? 'listbox' : 'combobox';
      case 'TEXTAREA': return 'textbox';
      case 'OPTION': return 'option';
      case 'INPUT':
        t = (el.type || 'text').toLowerCase();
        switch (t) {
          case 'hidden': return '';
          case 'checkbox': return 'checkbox';
          case 'radio': return 'radio';
          case 'button': case 'submit': case 'reset': case 'image': case 'file': return 'button';
          case 'range': return 'slider';
          case 'number': return 'spinbutton';
          case 'search': return 'searchbox';
          default: return 'textbox';
        }
      case 'H1': case 'H2': case 'H3': case 'H4': case 'H5': case 'H6': return 'heading';
      case 'NAV': return 'navigation';
      case 'MAIN': return 'main';
      case 'ASIDE': return 'complementary';
      case 'HEADER': return el.closest('article,aside,main,nav,section') ? '' : 'banner';
      case 'FOOTER': return el.closest('article,aside,main,nav,section') ? '' : 'contentinfo';
      case 'FORM': return 'form';
      case 'SECTION': return (el.hasAttribute('aria-label') || el.hasAttribute('aria-labelledby')) ? 'region' : '';
      case 'DIALOG': return 'dialog';
      case 'IMG': return el.getAttribute('alt') === '' ? '' : 'img';
      case 'TABLE': return 'table';
      case 'UL': case 'OL': return 'list';
      case 'LI': return 'listitem';
      case 'IFRAME': return 'iframe';
    }
    if (el.isContentEditable && (!el.parentElement || !el.parentElement.isContentEditable)) return 'textbox';
    return '';
  }

  function roleOf(el) {
    var r = (el.getAttribute('role') || '').trim().split(/\s+/)[0];
    return r || implicitRole(el);
  }

  function isInteractive(el, role) {
    if (INTERACTIVE[role]) return true;
    var tag = el.tagName;
    if (tag === 'INPUT') return (el.type || '').toLowerCase() !== 'hidden';
    if (tag === 'BUTTON' || tag === 'SELECT' || tag === 'TEXTAREA' || tag === 'SUMMARY') return true;
    if (tag === 'A' && el.hasAttribute('href')) return true;
    if ((tag === 'VIDEO' || tag === 'AUDIO') && el.hasAttribute('controls')) return true;
    if (el.isContentEditable && (!el.parentElement || !el.parentElement.isContentEditable)) return true;
    if (el.hasAttribute('onclick')) return true;
    var ti = el.getAttribute('tabindex');
    if (ti !== null && ti !== '' && +ti >= 0 && tag !== 'BODY' && tag !== 'HTML') return true;
    return false;
  }

  function textOf(el) {
    return clean(el.innerText !== undefined ? el.innerText : el.textContent);
  }

  function nameOf(el, role) {
    var n = el.getAttribute('aria-label');
    if (n && n.trim()) return clean(n);
    var lb = el.getAttribute('aria-labelledby');
    if (lb) {
      var doc = el.ownerDocument, parts = [];
      lb.split(/\s+/).forEach(function (id) { var x = doc.getElementById(id); if (x) parts.push(x.innerText || x.textContent); });
      if (parts.length) return clean(parts.join(' '));
    }
    var tag = el.tagName;
    if (tag === 'INPUT' || tag === 'TEXTAREA' || tag === 'SELECT') {
      var t = (el.type || '').toLowerCase();
      if (t === 'submit' || t === 'button' || t === 'reset') return clean(el.value || (t === 'submit' ? 'Submit' : t === 'reset' ? 'Reset' : ''));
      if (t === 'image') return clean(el.alt || el.value || 'Submit');
      if (el.labels && el.labels.length) {
        var ls = [];
        for (var i = 0; i < el.labels.length; i++) ls.push(el.labels[i].innerText || el.labels[i].textContent);
        var s = clean(ls.join(' '));
        if (s) return s;
      }
      if (el.placeholder) return clean(el.placeholder);
      return clean(el.title || '');
    }
    if (tag === 'IMG' || tag === 'AREA') return clean(el.getAttribute('alt') || el.title || '');
    if (NAME_FROM_CONTENT[role] || INTERACTIVE[role] && role !== 'textbox' && role !== 'combobox' && role !== 'listbox' || tag === 'A' || tag === 'BUTTON') {
      var txt = textOf(el);
      if (txt) return txt;
      var img = el.querySelector && el.querySelector('img[alt],svg title,[aria-label]');
      if (img) return clean(img.getAttribute('alt') || img.getAttribute('aria-label') || img.textContent);
    }
    return clean(el.title || '');
  }

  function states(el, role) {
    var out = [];
    var tag = el.tagName;
    if (tag === 'INPUT' || tag === 'TEXTAREA') {
      var t = (el.type || '').toLowerCase();
      if (t === 'checkbox' || t === 'radio') { if (el.checked) out.push('checked'); }
      else if (t !== 'submit' && t !== 'button' && t !== 'reset' && t !== 'image' && t !== 'file') {
        if (t === 'password') { if (el.value) out.push('value="••••"'); }
        else if (el.value) out.push('value=' + JSON.stringify(clean(el.value, 80)));
      }
    } else if (tag === 'SELECT') {
      var o = el.selectedOptions && el.selectedOptions[0];
      if (o) out.push('value=' + JSON.stringify(clean(o.text, 80)));
    } else if (el.isContentEditable && role === 'textbox') {
      var v = clean(el.innerText, 80);
      if (v) out.push('value=' + JSON.stringify(v));
    }
    var ac = el.getAttribute('aria-checked');
    if (ac === 'true') out.push('checked');
    if (el.disabled || el.getAttribute('aria-disabled') === 'true') out.push('disabled');
    var ex = el.getAttribute('aria-expanded');
    if (ex) out.push(ex === 'true' ? 'expanded' : 'collapsed');
    if (el.getAttribute('aria-selected') === 'true' || tag === 'OPTION' && el.selected) out.push('selected');
    if (role === 'heading') {
      var lv = el.getAttribute('aria-level') || (/^H[1-6]$/.test(tag) ? tag[1] : '');
      if (lv) out.push('level=' + lv);
    }
    if (el.ownerDocument.activeElement === el) out.push('focused');
    return out.length ? ' ' + out.join(' ') : '';
  }

  // frameOf is the frame element that shows window w in its parent, or
  // null for the top window (or a frame the page cannot reach).
  function frameOf(w) {
    if (!w || w === window) return null;
    try { return w.frameElement; } catch (e) { return null; }
  }

  // frameOrigin is where a frame element's document starts in the
  // viewport of the frame element's own document: its content box, inside
  // its border and its padding.
  function frameOrigin(fe) {
    var fr = fe.getBoundingClientRect(), cs = fe.ownerDocument.defaultView.getComputedStyle(fe);
    return [fr.left + fe.clientLeft + (parseFloat(cs.paddingLeft) || 0),
      fr.top + fe.clientTop + (parseFloat(cs.paddingTop) || 0)];
  }

  // rectOf is el's box in the top window's viewport (iframes add offsets).
  function rectOf(el) {
    var r = el.getBoundingClientRect();
    var x = r.left, y = r.top;
    for (var fe = frameOf(el.ownerDocument.defaultView); fe; fe = frameOf(fe.ownerDocument.defaultView)) {
      var o = frameOrigin(fe);
      x += o[0]; y += o[1];
    }
    return { x: x, y: y, w: r.width, h: r.height };
  }

  // framesShow reports whether point (x, y) of doc's viewport shows in the
  // top window: at each level up, the frame element is what its own
  // document has at that point (no overlay of the parent page covers it).
  function framesShow(doc, x, y) {
    for (var fe = frameOf(doc.defaultView); fe; fe = frameOf(fe.ownerDocument.defaultView)) {
      var o = frameOrigin(fe);
      x += o[0]; y += o[1];
      var root = fe.getRootNode && fe.getRootNode();
      var d = root && root.elementFromPoint ? root : fe.ownerDocument;
      if (d.elementFromPoint(x, y) !== fe) return false;
    }
    return true;
  }

  function shown(el) {
    if (el.checkVisibility) {
      if (el.checkVisibility({ visibilityProperty: true })) return 1;
      var cs = getComputedStyle(el);
      return cs.display === 'contents' ? 2 : 0; // 2: no box, children may show
    }
    var s = getComputedStyle(el);
    return s.display === 'none' || s.visibility === 'hidden' ? 0 : 1;
  }

  // onTop reports whether el is what a click at its box would hit.
  function onTop(el, r, vw, vh) {
    var root = el.getRootNode && el.getRootNode();
    var doc = root && root.elementFromPoint ? root : el.ownerDocument;
    // Local coordinates of el's own document for elementFromPoint.
    var lr = el.getBoundingClientRect();
    var pts = [[0.5, 0.5], [0.2, 0.2], [0.8, 0.8], [0.2, 0.8], [0.8, 0.2]];
    for (var i = 0; i < pts.length; i++) {
      var px = r.x + r.w * pts[i][0], py = r.y + r.h * pts[i][1];
      if (px < 0 || py < 0 || px >= vw || py >= vh) continue;
      var lx = lr.left + lr.width * pts[i][0], ly = lr.top + lr.height * pts[i][1];
      var hit = doc.elementFromPoint(lx, ly);
      if (!hit) continue;
      var mine = hit === el || el.contains(hit) || hit.contains(el) && hit.getRootNode() !== el.getRootNode() ||
        hit.tagName === 'LABEL' && el.labels && Array.prototype.indexOf.call(el.labels, hit) >= 0;
      if (mine && framesShow(el.ownerDocument, lx, ly)) return true;
    }
    return false;
  }

  // frameCheck is the page's side of frame reuse (browser/reuse.go): the
  // latest change in any of its documents, the work they have pending
  // within quiet ms, whether any draws on its own, and the moment asked.
  // A document without the tracker, or one it cannot look into, makes
  // the answer unknown (ok false).
  function frameCheck(quiet) {
    var K = Symbol.for('orchard.pending');
    var out = { now: performance.timeOrigin + performance.now(), changed: 0, pending: 0, live: false, ok: true };
    var walk = function (win, depth) {
      var P = win[K];
      if (!P || !P.changed) { out.ok = false; return; }
      var c = P.changed();
      if (c > out.changed) out.changed = c;
      out.pending += P.pending(quiet);
      if (P.live()) out.live = true;
      for (var i = 0; i < win.frames.length; i++) {
        if (depth > 3 || i >= 50) { out.ok = false; return; }
        walk(win.frames[i], depth + 1);
      }
    };
    try { walk(window, 0); } catch (e) { out.ok = false; }
    return out;
  }

  function observe(o) {
    var de = document.documentElement, b = document.body;
    var res = {
      url: location.href, title: document.title,
      vw: window.innerWidth, vh: window.innerHeight, sx: window.scrollX, sy: window.scrollY,
      pw: Math.max(de ? de.scrollWidth : 0, b ? b.scrollWidth : 0, window.innerWidth),
      ph: Math.max(de ? de.scrollHeight : 0, b ? b.scrollHeight : 0, window.innerHeight)
    };
    if (o.som || o.ax) {
      marks = [];
      observed = true;
      var els = [], lines = [], nodes = 0, truncated = false;
      var lastText = -1; // index in lines of the last text line, for merging
      var lastTextDepth = -1;
      var emit = function (depth, s) {
        if (lines.length >= MAX_LINES) { truncated = true; return; }
        lines.push(new Array(depth + 1).join('  ') + s);
        lastText = -1;
      };
      var emitText = function (depth, s) {
        if (lastText === lines.length - 1 && lastTextDepth === depth && lastText >= 0) {
          var l = lines[lastText];
          if (l.length < MAX_LINE) lines[lastText] = l.slice(0, -1) + ' ' + s.slice(0, MAX_LINE - l.length) + '"';
          return;
        }
        if (lines.length >= MAX_LINES) { truncated = true; return; }
        lines.push(new Array(depth + 1).join('  ') + 'text ' + JSON.stringify(s.slice(0, MAX_LINE)));
        lastText = lines.length - 1; lastTextDepth = depth;
      };
      var visit = function (node, depth, quiet, axHidden) {
        if (++nodes > MAX_NODES) { truncated = true; return; }
        if (node.nodeType === 3) {
          if (o.ax && !quiet && !axHidden) {
            var tx = node.data.replace(/\s+/g, ' ').trim();
            if (tx) emitText(depth, tx);
          }
          return;
        }
        if (node.nodeType !== 1) {
          if (node.nodeType === 11 || node.nodeType === 9) visitChildren(node, depth, quiet, axHidden);
          return;
        }
        var el = node;
        if (SKIP[el.tagName]) return;
        var vis = shown(el);
        if (vis === 0) return;
        var hiddenHere = axHidden || el.getAttribute('aria-hidden') === 'true';
        var role = vis === 1 ? roleOf(el) : '';
        var inter = vis === 1 && isInteractive(el, role);
        var id = 0;
        if (inter && marks.length < MAX_MARKS) { marks.push(el); id = marks.length; }
        var childDepth = depth, childQuiet = quiet;
        if (o.ax && !hiddenHere && (inter || LANDMARK[role] || role === 'heading' || role === 'img' || role === 'iframe' || role === 'table' || role === 'list' && el.children.length > 1)) {
          var nm = nameOf(el, role || 'generic');
          if (!(role === 'form' || role === 'region') || nm || inter) {
            emit(depth, (id ? '[' + id + '] ' : '') + (role || el.tagName.toLowerCase()) + (nm ? ' ' + JSON.stringify(nm) : '') + states(el, role));
            childDepth = depth + 1;
            if (NAME_FROM_CONTENT[role] || inter && nm) childQuiet = true;
          }
        }
        if (o.som && id) {
          var r = rectOf(el);
          if (r.w > 0 && r.h > 0) {
            var inView = r.x < res.vw && r.y < res.vh && r.x + r.w > 0 && r.y + r.h > 0;
            if (o.full || inView && onTop(el, r, res.vw, res.vh)) {
              var x = r.x, y = r.y, w = r.w, h = r.h;
              if (!o.full) {
                x = Math.max(0, r.x); y = Math.max(0, r.y);
                w = Math.min(res.vw, r.x + r.w) - x; h = Math.min(res.vh, r.y + r.h) - y;
              } else {
                x += res.sx; y += res.sy;
              }
              els.push({ id: id, role: role || el.tagName.toLowerCase(), name: nameOf(el, role), bbox: [x, y, w, h] });
            }
          }
        }
        if (el.tagName === 'IFRAME') {
          var cd = null;
          try { cd = el.contentDocument; } catch (e) { cd = null; }
          if (cd && cd.documentElement) visit(cd.documentElement, childDepth, childQuiet, hiddenHere);
          return;
        }
        if (el.shadowRoot) visitChildren(el.shadowRoot, childDepth, childQuiet, hiddenHere);
        visitChildren(el, childDepth, childQuiet, hiddenHere);
      };
      var visitChildren = function (n, depth, quiet, axHidden) {
        for (var c = n.firstChild; c; c = c.nextSibling) visit(c, depth, quiet, axHidden);
      };
      if (document.documentElement) visit(document.documentElement, 0, false, false);
      if (o.som) res.elements = els;
      if (o.ax) res.ax = lines.join('\n') + (truncated ? '\n… (truncated)' : '');
    }
    if (o.text) {
      var t = document.body ? document.body.innerText : '';
      res.text = t.length > o.textMax ? t.slice(0, o.textMax) + '\n… (truncated)' : t;
    }
    res.wall = wall();
    if (o.fc) res.fc = frameCheck(o.fc);
    return res;
  }

  // wall returns the evidence that the page is a bot wall or a CAPTCHA
  // interstitial, whatever its status, or '': an element only challenge
  // pages have, or a CAPTCHA widget on a page that asks the visitor to
  // prove to be human, or a challenge page's title. A page that merely
  // mentions captchas, or a form with a CAPTCHA on it (a sign-in page),
  // is content, not a wall.
  var WALL_ELEMENTS = ['#challenge-running', '#challenge-form', '#cf-challenge-running', '#challenge-stage',
    '#challenge-error-text', 'script[src*="/cdn-cgi/challenge-platform"]', '#px-captcha',
    'script[src*="captcha-delivery.com"]', 'iframe[src*="captcha-delivery.com"]', 'form#captcha-form'];
  var WIDGETS = ['.g-recaptcha', '.h-captcha', '.cf-turnstile', 'iframe[src*="recaptcha"]', 'iframe[src*="hcaptcha"]',
    'iframe[src*="challenges.cloudflare.com"]', '[data-sitekey]'];
  var ASKS = ['verify you are human', 'verify you are a human', 'are you a robot', 'not a robot', 'unusual traffic',
    'checking your browser', 'checking if the site connection is secure', 'human verification',
    'complete the security check', 'press & hold', 'press and hold', 'prove you are human'];
  var TITLES = ['just a moment', 'attention required! | cloudflare', 'pardon our interruption', 'human verification',
    'are you a robot?', 'security check'];
  function wall() {
    var i, el;
    for (i = 0; i < WALL_ELEMENTS.length; i++) {
      if (document.querySelector(WALL_ELEMENTS[i])) return 'element ' + WALL_ELEMENTS[i];
    }
    var title = (document.title || '').trim().toLowerCase();
    for (i = 0; i < TITLES.length; i++) {
      if (title === TITLES[i] || title.indexOf(TITLES[i] + '...') === 0 || title.indexOf(TITLES[i] + '…') === 0) {
        return 'title "' + document.title.trim() + '"';
      }
    }
    var widget = '';
    for (i = 0; i < WIDGETS.length && !widget; i++) {
      if (document.querySelector(WIDGETS[i])) widget = WIDGETS[i];
    }
    if (!widget) return '';
    var text = (title + ' ' + (document.body ? document.body.innerText : '').slice(0, 3000)).toLowerCase();
    for (i = 0; i < ASKS.length; i++) {
      if (text.indexOf(ASKS[i]) >= 0) return 'widget ' + widget + ' with "' + ASKS[i] + '"';
    }
    return '';
  }

  function deepQuery(root, sel) {
    var el = root.querySelector(sel);
    if (el) return el;
    var all = root.querySelectorAll('*');
    for (var i = 0; i < all.length; i++) {
      if (all[i].shadowRoot) {
        el = deepQuery(all[i].shadowRoot, sel);
        if (el) return el;
      }
    }
    return null;
  }

  // find resolves a target: {id: n} from the last observation, or {sel}.
  function find(t) {
    if (t.id !== undefined) {
      if (!observed) return { err: 'stale' };
      var el = marks[t.id - 1];
      if (!el) return { err: 'nosuch' };
      if (!el.isConnected) return { err: 'stale' };
      return { el: el };
    }
    var e;
    try { e = deepQuery(document, t.sel); } catch (x) { return { err: 'selector', msg: String(x && x.message || x) }; }
    return e ? { el: e } : { err: 'nosuch' };
  }

  // locate scrolls the target into view when it is not and returns the
  // centre of its box in viewport coordinates.
  function locate(t) {
    var f = find(t);
    if (f.err) return f;
    var el = f.el, r = rectOf(el);
    var vw = window.innerWidth, vh = window.innerHeight;
    if (r.w === 0 && r.h === 0 && el.getClientRects().length === 0) return { err: 'hidden' };
    if (r.x < 0 || r.y < 0 || r.x + r.w > vw || r.y + r.h > vh || clipped(el)) {
      el.scrollIntoView({ block: 'center', inline: 'center', behavior: 'instant' });
      r = rectOf(el);
    }
    var p = target(el, r);
    var cx = Math.min(Math.max(p[0], 0), vw - 1), cy = Math.min(Math.max(p[1], 0), vh - 1);
    return { x: cx, y: cy, w: r.w, h: r.h, tag: el.tagName.toLowerCase() };
  }

  // flatParent is n's parent in the flat tree: a slotted node's slot, a
  // shadow root's host.
  function flatParent(n) {
    if (n.assignedSlot) return n.assignedSlot;
    var p = n.parentNode;
    return p && p.nodeType === 11 ? p.host : p;
  }

  // clipped reports whether the centre of el's box is cut off by a
  // scroll container (or the viewport of el's own frame) in its document,
  // though it may be within the top viewport's box.
  function clipped(el) {
    var r = el.getBoundingClientRect(), win = el.ownerDocument.defaultView;
    var cx = r.left + r.width / 2, cy = r.top + r.height / 2;
    if (cx < 0 || cy < 0 || cx >= win.innerWidth || cy >= win.innerHeight) return true;
    for (var a = flatParent(el); a && a.nodeType === 1; a = flatParent(a)) {
      var cs = win.getComputedStyle(a);
      if (cs.overflowX === 'visible' && cs.overflowY === 'visible') continue;
      var ar = a.getBoundingClientRect();
      if (cx < ar.left || cx >= ar.right || cy < ar.top || cy >= ar.bottom) return true;
    }
    return false;
  }

  // target is the point a click on el should go to, in the top viewport:
  // the centre of its box when that hits el, else the centre of the first
  // of its line boxes that does — a link whose text wraps has a box whose
  // centre falls between its fragments, on whatever is behind them.
  function target(el, r) {
    var lr = el.getBoundingClientRect(), dx = r.x - lr.left, dy = r.y - lr.top;
    var root = el.getRootNode && el.getRootNode();
    var doc = root && root.elementFromPoint ? root : el.ownerDocument;
    var hits = function (x, y) {
      var h = doc.elementFromPoint(x, y);
      return h && (h === el || el.contains(h));
    };
    var cx = lr.left + lr.width / 2, cy = lr.top + lr.height / 2;
    if (!hits(cx, cy)) {
      var rs = el.getClientRects();
      for (var i = 0; i < rs.length; i++) {
        var x = rs[i].left + rs[i].width / 2, y = rs[i].top + rs[i].height / 2;
        if (rs[i].width > 0 && rs[i].height > 0 && hits(x, y)) { cx = x; cy = y; break; }
      }
    }
    return [cx + dx, cy + dy];
  }

  function editableOf(el) {
    var ok = function (e) {
      if (e.tagName === 'TEXTAREA') return !e.readOnly && !e.disabled;
      if (e.tagName === 'INPUT') {
        var t = (e.type || 'text').toLowerCase();
        return ['text', 'search', 'email', 'url', 'tel', 'password', 'number', 'date', 'datetime-local', 'month', 'time', 'week', ''].indexOf(t) >= 0 && !e.readOnly && !e.disabled;
      }
      return e.isContentEditable;
    };
    if (ok(el)) return el;
    var inner = el.querySelector && el.querySelector('input,textarea,[contenteditable=""],[contenteditable="true"]');
    if (inner && ok(inner)) return inner;
    if (el.tagName === 'LABEL' && el.control && ok(el.control)) return el.control;
    return null;
  }

  // focus puts the caret at the end of the target's text, or selects all
  // of it when clear is set, so that the next insertText appends or
  // replaces. Without a target it uses the focused element.
  function focus(t, clear) {
    var el;
    if (t) {
      var f = find(t);
      if (f.err) return f;
      el = editableOf(f.el);
      if (!el) return { err: 'not_editable', tag: f.el.tagName.toLowerCase() };
      var r = rectOf(el);
      if (r.x < 0 || r.y < 0 || r.x + r.w > window.innerWidth || r.y + r.h > window.innerHeight) {
        el.scrollIntoView({ block: 'center', inline: 'center', behavior: 'instant' });
      }
      el.focus();
    } else {
      el = document.activeElement;
      while (el && el.shadowRoot && el.shadowRoot.activeElement) el = el.shadowRoot.activeElement;
      while (el && el.tagName === 'IFRAME') {
        try { el = el.contentDocument.activeElement; } catch (e) { break; }
      }
      if (!el) return { ok: true };
    }
    var doc = el.ownerDocument, win = doc.defaultView;
    if (el.tagName === 'INPUT' || el.tagName === 'TEXTAREA') {
      try {
        if (clear) el.select();
        else if (t) { var n = el.value.length; el.setSelectionRange(n, n); }
      } catch (e) { /* number and date inputs have no selection */ if (clear) el.select && el.select(); }
    } else if (el.isContentEditable) {
      var sel = win.getSelection(), range = doc.createRange();
      range.selectNodeContents(el);
      if (!clear && t) range.collapse(false);
      if (clear || t) { sel.removeAllRanges(); sel.addRange(range); }
    }
    return { ok: true };
  }

  function selectOption(t, value) {
    var f = find(t);
    if (f.err) return f;
    var el = f.el;
    if (el.tagName !== 'SELECT') {
      var inner = el.querySelector && el.querySelector('select');
      if (el.tagName === 'LABEL' && el.control && el.control.tagName === 'SELECT') inner = el.control;
      if (!inner) return { err: 'not_select', tag: el.tagName.toLowerCase() };
      el = inner;
    }
    var opts = el.options, pick = -1, i;
    for (i = 0; i < opts.length && pick < 0; i++) if (opts[i].value === value) pick = i;
    for (i = 0; i < opts.length && pick < 0; i++) if (clean(opts[i].text) === clean(value)) pick = i;
    var lower = clean(value).toLowerCase();
    for (i = 0; i < opts.length && pick < 0; i++) if (clean(opts[i].text).toLowerCase() === lower) pick = i;
    if (pick < 0) {
      var have = [];
      for (i = 0; i < opts.length && i < 20; i++) have.push(clean(opts[i].text, 40));
      return { err: 'no_option', options: have };
    }
    if (opts[pick].disabled || el.disabled) return { err: 'disabled' };
    el.focus();
    if (el.multiple) opts[pick].selected = true; else el.selectedIndex = pick;
    el.dispatchEvent(new Event('input', { bubbles: true, composed: true }));
    el.dispatchEvent(new Event('change', { bubbles: true }));
    return { ok: true, value: opts[pick].value };
  }

  // fileInput finds the file input for an upload target (the element, a
  // label's control, or a file input inside it) and keeps it for picked.
  var pickedEl = null;
  function fileInput(t) {
    pickedEl = null;
    var f = find(t);
    if (f.err) return f;
    var el = f.el;
    var isFile = function (e) { return e && e.tagName === 'INPUT' && (e.type || '').toLowerCase() === 'file'; };
    if (el.tagName === 'LABEL' && isFile(el.control)) el = el.control;
    else if (!isFile(el)) el = el.querySelector && el.querySelector('input[type=file]');
    if (!isFile(el)) return { err: 'not_file', tag: f.el.tagName.toLowerCase() };
    pickedEl = el;
    return { ok: true };
  }
  function picked() { var e = pickedEl; pickedEl = null; return e; }

  return { observe: observe, frameCheck: frameCheck, wall: wall, locate: locate, focus: focus, selectOption: selectOption, fileInput: fileInput, picked: picked };
})()

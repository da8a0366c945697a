// state_export.js is an expression: a function of (wantStorage, limit)
// that resolves to what ExportState keeps of one tab's page — scroll,
// changed form fields, focus, sessionStorage, and with wantStorage the
// origin's localStorage and IndexedDB (records as JSON, what JSON cannot
// hold listed as skipped). It gives up with too_large once the records
// pass limit characters.
(function (wantStorage, limit) {
  var out = { origin: location.origin, scroll: { x: scrollX, y: scrollY }, scrolled: [], fields: [], skipped: [] };
  var size = 0;
  function sel(el) {
    var parts = [];
    while (el && el.nodeType === 1) {
      if (el.id) {
        var s = '#' + CSS.escape(el.id);
        try { if (document.querySelectorAll(s).length === 1) { parts.unshift(s); return parts.join(' > '); } } catch (e) {}
      }
      if (el === document.documentElement) { parts.unshift('html'); break; }
      var n = 1, sib = el;
      while ((sib = sib.previousElementSibling)) if (sib.localName === el.localName) n++;
      parts.unshift(CSS.escape(el.localName) + ':nth-of-type(' + n + ')');
      el = el.parentElement;
    }
    return parts.join(' > ');
  }
  function items(st) {
    var o = {};
    for (var i = 0; i < st.length; i++) { var k = st.key(i); o[k] = st.getItem(k); size += k.length + o[k].length; }
    return o;
  }
  // why returns '' for a value JSON holds as it is, else what it is.
  function why(v, depth) {
    if (v === null) return '';
    var t = typeof v;
    if (t === 'string' || t === 'boolean') return '';
    if (t === 'number') return isFinite(v) ? '' : 'a non-finite number';
    if (t !== 'object') return 'a ' + t;
    if (depth > 64) return 'nested too deep';
    var r;
    if (Array.isArray(v)) {
      for (var i = 0; i < v.length; i++) if ((r = why(v[i], depth + 1))) return r;
      return '';
    }
    var p = Object.getPrototypeOf(v);
    if (p !== Object.prototype && p !== null) return 'a ' + ((v.constructor && v.constructor.name) || 'non-plain object');
    for (var k in v) if ((r = why(v[k], depth + 1))) return r;
    return '';
  }
  function req(r) { return new Promise(function (res, rej) { r.onsuccess = function () { res(r.result); }; r.onerror = function () { rej(r.error); }; }); }
  async function idb() {
    var dbs = [], infos = await indexedDB.databases();
    for (var i = 0; i < infos.length; i++) {
      var name = infos[i].name;
      var open = indexedDB.open(name);
      open.onupgradeneeded = function () { open.transaction.abort(); };
      var db;
      try { db = await req(open); } catch (e) { out.skipped.push({ kind: 'indexeddb_database', origin: location.origin, database: name, reason: String(e) }); continue; }
      var d = { name: name, version: db.version, stores: [] };
      var names = Array.from(db.objectStoreNames);
      for (var j = 0; j < names.length; j++) {
        var st = db.transaction(names[j], 'readonly').objectStore(names[j]);
        var s = { name: names[j], key_path: st.keyPath, auto_increment: st.autoIncrement, indexes: [], records: [] };
        Array.from(st.indexNames).forEach(function (n) { var x = st.index(n); s.indexes.push({ name: x.name, key_path: x.keyPath, unique: x.unique, multi_entry: x.multiEntry }); });
        d.stores.push(s);
        await new Promise(function (res, rej) {
          var c = st.openCursor();
          c.onerror = function () { rej(c.error); };
          c.onsuccess = function () {
            var cur = c.result;
            if (!cur) return res();
            var k = cur.primaryKey, v = cur.value, r = why(k, 0) ? 'the key is ' + why(k, 0) : why(v, 0);
            if (r) {
              out.skipped.push({ kind: 'indexeddb_record', origin: location.origin, database: name, store: s.name, key: why(k, 0) ? String(k) : k, reason: 'the value holds ' + r + ', which JSON cannot express' });
            } else {
              size += JSON.stringify(v).length + JSON.stringify(k).length;
              if (size > limit) { out.too_large = true; return res(); }
              s.records.push({ key: k, value: v });
            }
            cur.continue();
          };
        });
        if (out.too_large) break;
      }
      db.close();
      dbs.push(d);
      if (out.too_large) break;
    }
    return dbs;
  }
  var els = document.querySelectorAll('input,textarea,select,[contenteditable]');
  for (var i = 0; i < els.length && out.fields.length < 500; i++) {
    var el = els[i], tag = el.localName, f = null;
    if (tag === 'input') {
      var ty = (el.type || 'text').toLowerCase();
      if (ty === 'file') {
        if (el.files && el.files.length) out.skipped.push({ kind: 'form_field', selector: sel(el), reason: 'a page cannot set the files of a file input' });
        continue;
      }
      if (/^(hidden|submit|button|reset|image)$/.test(ty)) continue;
      if (ty === 'checkbox' || ty === 'radio') { if (el.checked !== el.defaultChecked) f = { kind: ty, checked: el.checked }; }
      else if (el.value !== el.defaultValue) f = { kind: 'text', value: el.value };
    } else if (tag === 'textarea') {
      if (el.value !== el.defaultValue) f = { kind: 'text', value: el.value };
    } else if (tag === 'select') {
      var changed = false, chosen = [], def = -1;
      for (var j = 0; j < el.options.length; j++) {
        var o = el.options[j];
        if (o.selected) chosen.push(o.value);
        if (o.defaultSelected && def < 0) def = j;
        if (el.multiple && o.selected !== o.defaultSelected) changed = true;
      }
      if (!el.multiple) changed = el.selectedIndex !== (def < 0 ? (el.options.length ? 0 : -1) : def);
      if (changed) f = { kind: 'select', selected: chosen };
    } else if (el.isContentEditable && !(el.parentElement && el.parentElement.isContentEditable)) {
      f = { kind: 'contenteditable', value: el.innerText };
    }
    if (f) { f.selector = sel(el); size += JSON.stringify(f).length; out.fields.push(f); }
  }
  var all = document.body ? document.body.getElementsByTagName('*') : [];
  for (var i = 0; i < all.length && i < 20000 && out.scrolled.length < 20; i++) {
    var e = all[i];
    if (e.scrollTop || e.scrollLeft) out.scrolled.push({ selector: sel(e), left: e.scrollLeft, top: e.scrollTop });
  }
  var a = document.activeElement;
  if (a && a !== document.body && a !== document.documentElement) {
    out.focus = { selector: sel(a) };
    try {
      if (typeof a.selectionStart === 'number') {
        out.focus.selection_start = a.selectionStart;
        out.focus.selection_end = a.selectionEnd;
        out.focus.selection_direction = a.selectionDirection;
      }
    } catch (e) {}
  }
  try { out.session = items(sessionStorage); } catch (e) {}
  if (!wantStorage) return out;
  try { out.local = items(localStorage); } catch (e) {}
  if (!window.indexedDB || !indexedDB.databases) return out;
  return idb().then(function (dbs) { out.idb = dbs; return out; }, function (e) {
    out.skipped.push({ kind: 'indexeddb_database', origin: location.origin, reason: String(e) });
    return out;
  });
})

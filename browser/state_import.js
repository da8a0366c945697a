// state_import.js is an expression: a function of (local, dbs) that
// replaces the origin's localStorage with local and each IndexedDB
// database named in dbs with the one given, its stores, indexes and
// records (api.IDBDatabase as JSON).
(async function (local, dbs) {
  function req(r) { return new Promise(function (res, rej) { r.onsuccess = function () { res(r.result); }; r.onerror = function () { rej(r.error); }; }); }
  localStorage.clear();
  for (var k in local) localStorage.setItem(k, local[k]);
  for (var i = 0; i < dbs.length; i++) {
    var d = dbs[i];
    var del = indexedDB.deleteDatabase(d.name);
    await new Promise(function (res, rej) { del.onsuccess = res; del.onerror = function () { rej(del.error); }; });
    var open = indexedDB.open(d.name, d.version || 1);
    open.onupgradeneeded = function () {
      var db = open.result;
      (d.stores || []).forEach(function (s) {
        var o = { autoIncrement: !!s.auto_increment };
        if (s.key_path !== null && s.key_path !== undefined) o.keyPath = s.key_path;
        var st = db.createObjectStore(s.name, o);
        (s.indexes || []).forEach(function (x) { st.createIndex(x.name, x.key_path, { unique: !!x.unique, multiEntry: !!x.multi_entry }); });
      });
    };
    var db = await req(open);
    var names = (d.stores || []).map(function (s) { return s.name; });
    if (names.length) {
      await new Promise(function (res, rej) {
        var tx = db.transaction(names, 'readwrite');
        tx.oncomplete = res;
        tx.onerror = tx.onabort = function () { rej(tx.error || new Error('transaction aborted')); };
        d.stores.forEach(function (s) {
          var st = tx.objectStore(s.name), inline = s.key_path !== null && s.key_path !== undefined;
          (s.records || []).forEach(function (r) { if (inline) st.put(r.value); else st.put(r.value, r.key); });
        });
      });
    }
    db.close();
  }
  return true;
})

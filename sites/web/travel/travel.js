// SkyHop: flight search over a deterministic timetable. Flights for a
// route and date come from a PRNG seeded by the route and date, so the
// same search always shows the same flights.
var Travel = (function () {
  var TODAY = '2027-01-15', LAST = '2027-12-31';
  var CABINS = { economy: 1, premium: 1.6, business: 2.8 };
  var airports = null, airlines = null;

  function load() {
    if (airports) return Promise.resolve();
    return Promise.all([fetch('data/airports.json').then(function (r) { return r.json(); }), fetch('data/airlines.json').then(function (r) { return r.json(); })])
      .then(function (d) { airports = d[0]; airlines = d[1]; });
  }
  function fnv(s) { var h = 0x811c9dc5; for (var i = 0; i < s.length; i++) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; } return h; }
  function rng(seed) { return function () { seed = (seed + 0x6d2b79f5) >>> 0; var t = seed; t = Math.imul(t ^ (t >>> 15), t | 1); t ^= t + Math.imul(t ^ (t >>> 7), t | 61); return ((t ^ (t >>> 14)) >>> 0) / 4294967296; }; }
  function pad(n) { return (n < 10 ? '0' : '') + n; }
  function clock(min) { min = ((min % 1440) + 1440) % 1440; return pad(Math.floor(min / 60)) + ':' + pad(min % 60); }
  function dur(min) { return Math.floor(min / 60) + 'h ' + pad(min % 60) + 'm'; }

  // flights lists the flights of a route on a date (YYYY-MM-DD), with
  // per-passenger economy prices in euros.
  function flights(from, to, date, lines) {
    lines = lines || airlines;
    if (!from || !to || from === to || !/^\d{4}-\d{2}-\d{2}$/.test(date)) return [];
    var r = rng(fnv(from + '-' + to + '-' + date)), base = 95 + fnv(from < to ? from + to : to + from) % 160;
    var n = 8 + Math.floor(r() * 5), out = [];
    for (var i = 0; i < n; i++) {
      var al = lines[Math.floor(r() * lines.length)], x = r(), stops = x < 0.35 ? 0 : x < 0.8 ? 1 : 2;
      var dep = 300 + Math.floor(r() * 17) * 60 + Math.floor(r() * 4) * 15;
      var d = base + stops * (55 + Math.floor(r() * 95));
      var price = Math.round(55 + base * 0.45 + r() * 190 - stops * 30);
      var num = al.code + (100 + Math.floor(r() * 900));
      out.push({ id: num + '-' + date.replace(/-/g, ''), number: num, airline: al.code, airlineName: al.name, from: from, to: to, date: date,
        depart: clock(dep), arrive: clock(dep + d), arriveNextDay: dep + d >= 1440, minutes: d, stops: stops, price: price });
    }
    return out;
  }
  function city(code) { var a = airports.filter(function (a) { return a.code === code; })[0]; return a ? a.city : code; }
  function param(name) { return new URLSearchParams(location.search).get(name); }
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return '&#' + c.charCodeAt(0) + ';'; }); }
  function stopsText(n) { return n === 0 ? 'Nonstop' : n === 1 ? '1 stop' : n + ' stops'; }
  function longDate(iso) {
    var m = ['January', 'February', 'March', 'April', 'May', 'June', 'July', 'August', 'September', 'October', 'November', 'December'];
    var p = iso.split('-'); return Number(p[2]) + ' ' + m[Number(p[1]) - 1] + ' ' + p[0];
  }
  function bookingRef(flightId, names) {
    var h = fnv(flightId + '|' + names.join('|').toLowerCase()), abc = 'ABCDEFGHJKLMNPQRSTUVWXYZ23456789', s = '';
    for (var i = 0; i < 6; i++) { s += abc[h % abc.length]; h = Math.floor(h / abc.length) + (i + 1) * 7919; }
    return s;
  }
  function header() {
    var h = document.createElement('header');
    h.className = 'site';
    h.innerHTML = '<a class="brand" href="./">SkyHop</a><nav><a href="./">Flights</a><a href="trips.html">My trips</a></nav>';
    document.body.insertBefore(h, document.body.firstChild);
    var f = document.createElement('footer');
    f.className = 'site';
    f.innerHTML = 'SkyHop &middot; fares in euros per passenger &middot; <a href="/">All sites</a>';
    document.body.appendChild(f);
  }
  var api = { load: load, flights: flights, city: city, param: param, esc: esc, clock: clock, dur: dur, stopsText: stopsText, longDate: longDate,
    bookingRef: bookingRef, header: header, fnv: fnv, TODAY: TODAY, LAST: LAST, CABINS: CABINS,
    airports: function () { return airports; }, airlines: function () { return airlines; } };
  return api;
})();
if (typeof module !== 'undefined') module.exports = Travel;

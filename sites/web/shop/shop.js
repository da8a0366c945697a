// Greenleaf Market: catalogue, cart and orders. The cart lives in
// localStorage under "shop.cart"; the last order under "shop.lastOrder".
var Shop = (function () {
  var CART = 'shop.cart', LAST = 'shop.lastOrder', ORDERS = 'shop.orders';
  var CATEGORIES = [
    { slug: 'electronics', name: 'Electronics' },
    { slug: 'home-kitchen', name: 'Home & Kitchen' },
    { slug: 'outdoor', name: 'Outdoor' },
    { slug: 'clothing', name: 'Clothing' },
    { slug: 'books', name: 'Books' }
  ];
  var FREE_SHIPPING = 75, STANDARD = 4.99, EXPRESS = 14.99;
  var products = null;

  function load() {
    if (products) return Promise.resolve(products);
    return fetch('data/products.json').then(function (r) { return r.json(); }).then(function (p) { products = p; return p; });
  }
  function byId(id) { return products.filter(function (p) { return p.id === Number(id); })[0]; }
  function slugOf(name) { return CATEGORIES.filter(function (c) { return c.name === name; })[0].slug; }
  function catName(slug) { var c = CATEGORIES.filter(function (c) { return c.slug === slug; })[0]; return c ? c.name : ''; }
  function money(n) { return '$' + n.toFixed(2); }
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return '&#' + c.charCodeAt(0) + ';'; }); }
  function stars(r) { var s = ''; for (var i = 1; i <= 5; i++) s += r >= i - 0.25 ? '\u2605' : '\u2606'; return s; }
  function initials(name) { return name.split(/\s+/).slice(0, 2).map(function (w) { return w[0]; }).join(''); }

  function cart() { try { return JSON.parse(localStorage.getItem(CART)) || []; } catch (e) { return []; } }
  function saveCart(c) { localStorage.setItem(CART, JSON.stringify(c)); renderCount(); }
  function add(id, qty) {
    var c = cart(), line = c.filter(function (l) { return l.id === id; })[0];
    if (line) line.qty += qty; else c.push({ id: id, qty: qty });
    saveCart(c);
  }
  function setQty(id, qty) {
    var c = cart().map(function (l) { if (l.id === id) l.qty = qty; return l; }).filter(function (l) { return l.qty > 0; });
    saveCart(c);
  }
  function remove(id) { saveCart(cart().filter(function (l) { return l.id !== id; })); }
  function count() { return cart().reduce(function (n, l) { return n + l.qty; }, 0); }
  function totals(lines, shipping) {
    var sub = lines.reduce(function (s, l) { return s + byId(l.id).price * l.qty; }, 0);
    sub = Math.round(sub * 100) / 100;
    var ship = shipping === 'express' ? EXPRESS : (sub >= FREE_SHIPPING || sub === 0 ? 0 : STANDARD);
    return { subtotal: sub, shipping: ship, total: Math.round((sub + ship) * 100) / 100 };
  }
  // orderNumber is derived from the cart contents and the shipping method
  // only (FNV-1a), so the same order always gets the same number.
  function orderNumber(lines, shipping) {
    var key = lines.slice().sort(function (a, b) { return a.id - b.id; })
      .map(function (l) { return l.id + 'x' + l.qty; }).join(',') + '|' + shipping;
    var h = 0x811c9dc5;
    for (var i = 0; i < key.length; i++) { h ^= key.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
    return 'GL-' + (10000000 + h % 90000000);
  }
  function renderCount() { var el = document.getElementById('cart-count'); if (el) el.textContent = count(); }
  function param(name) { return new URLSearchParams(location.search).get(name); }

  function header() {
    var h = document.createElement('header');
    h.className = 'site';
    h.innerHTML = '<a class="brand" href="./">Greenleaf Market</a>' +
      '<nav>' + CATEGORIES.map(function (c) { return '<a href="search.html?cat=' + c.slug + '">' + esc(c.name) + '</a>'; }).join('') + '</nav>' +
      '<form action="search.html" method="get" role="search"><input type="search" id="search-input" name="q" placeholder="Search products" aria-label="Search products">' +
      '<button type="submit" id="search-button">Search</button></form>' +
      '<a id="cart-link" href="cart.html">Cart (<span id="cart-count">0</span>)</a>';
    document.body.insertBefore(h, document.body.firstChild);
    var q = param('q'); if (q) document.getElementById('search-input').value = q;
    var f = document.createElement('footer');
    f.className = 'site';
    f.innerHTML = 'Greenleaf Market &middot; Free standard shipping on orders of $75 or more &middot; <a href="/">All sites</a>';
    document.body.appendChild(f);
    renderCount();
  }

  function card(p) {
    return '<div class="card product-card" data-id="' + p.id + '">' +
      '<div class="thumb">' + esc(initials(p.name)) + '</div>' +
      '<h3><a class="product-link" href="product.html?id=' + p.id + '">' + esc(p.name) + '</a></h3>' +
      '<div class="muted">' + esc(p.brand) + ' &middot; ' + esc(p.category) + '</div>' +
      '<div class="price">' + money(p.price) + '</div>' +
      '<div><span class="stars">' + stars(p.rating) + '</span> <span class="rating">' + p.rating.toFixed(1) + '</span> <span class="muted">(' + p.reviews + ')</span></div>' +
      '<div class="' + (p.stock > 0 ? 'in' : 'out') + '">' + (p.stock > 0 ? 'In stock' : 'Out of stock') + '</div></div>';
  }

  return { load: load, byId: byId, slugOf: slugOf, catName: catName, categories: CATEGORIES, money: money, esc: esc, stars: stars,
    initials: initials, cart: cart, add: add, setQty: setQty, remove: remove, saveCart: saveCart, totals: totals,
    orderNumber: orderNumber, header: header, card: card, param: param, LAST: LAST, ORDERS: ORDERS };
})();

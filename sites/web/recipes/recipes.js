// Pantry: recipes with tags and a servings scaler. Saved recipes live in
// localStorage under "recipes.saved".
var Recipes = (function () {
  var list = null, SAVED = 'recipes.saved';
  var TAGS = ['breakfast', 'main', 'soup', 'salad', 'dessert', 'baking', 'vegetarian', 'vegan', 'gluten-free', 'quick'];
  function load() {
    if (list) return Promise.resolve(list);
    return fetch('data/recipes.json').then(function (r) { return r.json(); }).then(function (l) { list = l; return l; });
  }
  function get(id) { return list.filter(function (r) { return r.id === id; })[0]; }
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return '&#' + c.charCodeAt(0) + ';'; }); }
  function param(name) { return new URLSearchParams(location.search).get(name); }
  function total(r) { return r.prep + r.cook; }
  function minutes(m) { return m < 60 ? m + ' min' : Math.floor(m / 60) + ' h' + (m % 60 ? ' ' + m % 60 + ' min' : ''); }
  // amount formats a scaled quantity: at most two decimals, no trailing zeros.
  function amount(q) { return String(Math.round(q * 100) / 100); }
  function saved() { try { return JSON.parse(localStorage.getItem(SAVED)) || []; } catch (e) { return []; } }
  function toggleSaved(id) { var s = saved(), i = s.indexOf(id); if (i >= 0) s.splice(i, 1); else s.push(id); localStorage.setItem(SAVED, JSON.stringify(s)); return i < 0; }
  function header() {
    var h = document.createElement('header');
    h.className = 'site';
    h.innerHTML = '<a class="brand" href="./">Pantry</a><nav><a href="./">All recipes</a><a href="saved.html">Saved recipes</a></nav>' +
      '<form action="./" method="get" role="search"><input type="search" id="search-input" name="q" placeholder="Search recipes" aria-label="Search recipes">' +
      '<button type="submit" id="search-button">Search</button></form>';
    document.body.insertBefore(h, document.body.firstChild);
    var q = param('q'); if (q) document.getElementById('search-input').value = q;
    var f = document.createElement('footer');
    f.className = 'site';
    f.innerHTML = 'Pantry &middot; home cooking, tested &middot; <a href="/">All sites</a>';
    document.body.appendChild(f);
  }
  function card(r) {
    return '<div class="card recipe-card" data-id="' + r.id + '"><h3><a class="recipe-link" href="recipe.html?id=' + r.id + '">' + esc(r.title) + '</a></h3>' +
      '<div class="muted">' + minutes(total(r)) + ' &middot; serves ' + r.servings + '</div>' +
      '<div><span class="stars">\u2605</span> <span class="rating">' + r.rating.toFixed(1) + '</span> <span class="muted">(' + r.reviews + ')</span></div>' +
      '<div>' + r.tags.map(function (t) { return '<span class="tag">' + esc(t) + '</span>'; }).join('') + '</div></div>';
  }
  return { load: load, get: get, esc: esc, param: param, total: total, minutes: minutes, amount: amount, saved: saved, toggleSaved: toggleSaved,
    header: header, card: card, TAGS: TAGS };
})();

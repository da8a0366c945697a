// Veloria Wiki: articles with infoboxes and [[id|label]] internal links.
var Wiki = (function () {
  var articles = null;
  function load() {
    if (articles) return Promise.resolve(articles);
    return fetch('data/articles.json').then(function (r) { return r.json(); }).then(function (a) { articles = a; return a; });
  }
  function get(id) { return articles.filter(function (a) { return a.id === id; })[0]; }
  function esc(s) { return String(s).replace(/[&<>"']/g, function (c) { return '&#' + c.charCodeAt(0) + ';'; }); }
  // links turns [[id|label]] into internal links; text keeps the labels.
  function links(s) { return esc(s).replace(/\[\[([a-z0-9-]+)\|([^\]]+)\]\]/g, function (_, id, label) { return '<a href="article.html?id=' + id + '">' + label + '</a>'; }); }
  function text(s) { return s.replace(/\[\[[a-z0-9-]+\|([^\]]+)\]\]/g, '$1'); }
  function param(name) { return new URLSearchParams(location.search).get(name); }
  function catHref(c) { return 'category.html?name=' + encodeURIComponent(c); }
  function categories() {
    var seen = {};
    articles.forEach(function (a) { a.categories.forEach(function (c) { seen[c] = (seen[c] || 0) + 1; }); });
    return Object.keys(seen).sort().map(function (c) { return { name: c, count: seen[c] }; });
  }
  function header() {
    var h = document.createElement('header');
    h.className = 'site';
    h.innerHTML = '<a class="brand" href="./">Veloria Wiki</a><nav><a href="./">Main page</a><a href="all.html">All articles</a><a href="categories.html">Categories</a></nav>' +
      '<form action="search.html" method="get" role="search"><input type="search" id="search-input" name="q" placeholder="Search the wiki" aria-label="Search the wiki">' +
      '<button type="submit" id="search-button">Search</button></form>';
    document.body.insertBefore(h, document.body.firstChild);
    var q = param('q'); if (q) document.getElementById('search-input').value = q;
    var f = document.createElement('footer');
    f.className = 'site';
    f.innerHTML = 'Veloria Wiki &middot; a fictional encyclopedia &middot; <a href="/">All sites</a>';
    document.body.appendChild(f);
  }
  return { load: load, get: get, esc: esc, links: links, text: text, param: param, catHref: catHref, categories: categories, header: header };
})();

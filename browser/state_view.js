// state_view.js is an expression: a function of a tab's view (scroll,
// scrolled elements, fields, focus as api.TabState gives them) that puts
// the page back as it was. Fields are set through the native setters and
// announced with input and change events, so frameworks that track
// values see them. It returns the selectors it found nothing for.
(function (v) {
  var missing = [];
  function q(s) { try { return document.querySelector(s); } catch (e) { return null; } }
  function fire(el) {
    el.dispatchEvent(new Event('input', { bubbles: true }));
    el.dispatchEvent(new Event('change', { bubbles: true }));
  }
  function setProp(el, proto, name, value) {
    var d = Object.getOwnPropertyDescriptor(proto, name);
    if (d && d.set) d.set.call(el, value); else el[name] = value;
  }
  (v.fields || []).forEach(function (f) {
    var el = q(f.selector);
    if (!el) { missing.push(f.selector); return; }
    if (f.kind === 'checkbox' || f.kind === 'radio') {
      if (el.checked !== !!f.checked) { setProp(el, HTMLInputElement.prototype, 'checked', !!f.checked); fire(el); }
    } else if (f.kind === 'select') {
      var want = f.selected || [];
      for (var i = 0; i < el.options.length; i++) el.options[i].selected = want.indexOf(el.options[i].value) >= 0;
      if (!el.multiple && want.length) setProp(el, HTMLSelectElement.prototype, 'value', want[0]);
      fire(el);
    } else if (f.kind === 'contenteditable') {
      if (el.innerText !== f.value) { el.innerText = f.value || ''; el.dispatchEvent(new InputEvent('input', { bubbles: true })); }
    } else {
      var proto = el.localName === 'textarea' ? HTMLTextAreaElement.prototype : HTMLInputElement.prototype;
      if (el.value !== f.value) { setProp(el, proto, 'value', f.value || ''); fire(el); }
    }
  });
  (v.scrolled || []).forEach(function (s) {
    var el = q(s.selector);
    if (!el) { missing.push(s.selector); return; }
    el.scrollLeft = s.left; el.scrollTop = s.top;
  });
  if (v.focus) {
    var el = q(v.focus.selector);
    if (!el) missing.push(v.focus.selector);
    else {
      el.focus({ preventScroll: true });
      if (typeof v.focus.selection_start === 'number') {
        try { el.setSelectionRange(v.focus.selection_start, v.focus.selection_end, v.focus.selection_direction || 'none'); } catch (e) {}
      }
    }
  }
  window.scrollTo(v.scroll ? v.scroll.x : 0, v.scroll ? v.scroll.y : 0);
  return missing;
})

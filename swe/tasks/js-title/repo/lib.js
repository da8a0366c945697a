// titleCase capitalises the first letter of every word of s.
function titleCase(s) {
  return s.charAt(0).toUpperCase() + s.slice(1);
}

module.exports = { titleCase };

const assert = require('assert');
const lib = require('./lib.js');

const tests = {
  one_word: () => assert.strictEqual(lib.titleCase('orchard'), 'Orchard'),
  empty: () => assert.strictEqual(lib.titleCase(''), ''),
  many_words: () => assert.strictEqual(lib.titleCase('apple pie recipe'), 'Apple Pie Recipe'),
};
const names = process.argv.length > 2 ? process.argv.slice(2) : Object.keys(tests);
let failed = 0;
for (const n of names) {
  if (!(n in tests)) { console.error('no test ' + n); process.exit(2); }
  try { tests[n](); console.log('ok ' + n); } catch (e) { failed++; console.log('FAIL ' + n + ': ' + e.message); }
}
process.exit(failed ? 1 : 0);

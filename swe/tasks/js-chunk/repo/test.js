const assert = require('assert');
const lib = require('./lib.js');

const tests = {
  exact: () => assert.deepStrictEqual(lib.chunk([1, 2, 3, 4], 2), [[1, 2], [3, 4]]),
  empty: () => assert.deepStrictEqual(lib.chunk([], 3), []),
  partial: () => assert.deepStrictEqual(lib.chunk([1, 2, 3], 2), [[1, 2], [3]]),
};
const names = process.argv.length > 2 ? process.argv.slice(2) : Object.keys(tests);
let failed = 0;
for (const n of names) {
  if (!(n in tests)) { console.error('no test ' + n); process.exit(2); }
  try { tests[n](); console.log('ok ' + n); } catch (e) { failed++; console.log('FAIL ' + n + ': ' + e.message); }
}
process.exit(failed ? 1 : 0);

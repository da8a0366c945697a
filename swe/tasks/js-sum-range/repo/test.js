const assert = require('assert');
const lib = require('./lib.js');

const tests = {
  inclusive: () => assert.strictEqual(lib.sumRange(1, 3), 6),
  single: () => assert.strictEqual(lib.sumRange(5, 5), 5),
  reversed: () => assert.strictEqual(lib.sumRange(3, 1), 0),
};
const names = process.argv.length > 2 ? process.argv.slice(2) : Object.keys(tests);
let failed = 0;
for (const n of names) {
  if (!(n in tests)) { console.error('no test ' + n); process.exit(2); }
  try { tests[n](); console.log('ok ' + n); } catch (e) { failed++; console.log('FAIL ' + n + ': ' + e.message); }
}
process.exit(failed ? 1 : 0);

#!/usr/bin/env bash
source ./lib.sh

test_none() { [ "$(join_by , )" = "" ]; }
test_single() { [ "$(join_by , a)" = a ]; }
test_many() { [ "$(join_by ', ' a b c)" = 'a, b, c' ]; }

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(none single many)
failed=0
for n in "${names[@]}"; do
  if ! declare -F "test_$n" >/dev/null; then echo "no test $n" >&2; exit 2; fi
  if ( "test_$n" ); then echo "ok $n"; else echo "FAIL $n"; failed=1; fi
done
exit $failed

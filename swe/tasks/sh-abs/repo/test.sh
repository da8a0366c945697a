#!/usr/bin/env bash
source ./lib.sh

test_positive() { [ "$(abs 5)" = 5 ]; }
test_zero() { [ "$(abs 0)" = 0 ]; }
test_negative() { [ "$(abs -4)" = 4 ]; }

names=("$@")
[ ${#names[@]} -eq 0 ] && names=(positive zero negative)
failed=0
for n in "${names[@]}"; do
  if ! declare -F "test_$n" >/dev/null; then echo "no test $n" >&2; exit 2; fi
  if ( "test_$n" ); then echo "ok $n"; else echo "FAIL $n"; failed=1; fi
done
exit $failed

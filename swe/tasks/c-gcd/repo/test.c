#include <stdio.h>
#include <string.h>
#include "lib.h"

static int t_coprime(void) { return gcd(9, 28) == 1; }
static int t_common(void) { return gcd(12, 18) == 6; }
static int t_zero(void) { return gcd(7, 0) == 7 && gcd(0, 5) == 5; }

static const struct { const char *name; int (*fn)(void); } tests[] = {{"coprime", t_coprime}, {"common", t_common}, {"zero", t_zero}};

int main(int argc, char **argv) {
  int failed = 0;
  for (int i = 0; i < (int)(sizeof tests / sizeof tests[0]); i++) {
    int want = argc < 2;
    for (int j = 1; j < argc; j++) if (strcmp(argv[j], tests[i].name) == 0) want = 1;
    if (!want) continue;
    if (tests[i].fn()) printf("ok %s\n", tests[i].name); else { printf("FAIL %s\n", tests[i].name); failed = 1; }
  }
  return failed;
}

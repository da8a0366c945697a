#include <stdio.h>
#include <string.h>
#include "lib.h"

static int t_even(void) { char s[] = "abcd"; reverse(s); return strcmp(s, "dcba") == 0; }
static int t_odd(void) { char s[] = "abc"; reverse(s); return strcmp(s, "cba") == 0; }
static int t_empty(void) { char s[] = ""; reverse(s); return s[0] == 0; }

static const struct { const char *name; int (*fn)(void); } tests[] = {{"even", t_even}, {"odd", t_odd}, {"empty", t_empty}};

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

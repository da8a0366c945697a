#include <string.h>
#include "lib.h"

/* reverse reverses the string s in place. */
void reverse(char *s) {
	size_t n = strlen(s);
	if (n == 0)
		return;
	for (size_t i = 0; i < (n - 1) / 2; i++) {
		char t = s[i];
		s[i] = s[n - 1 - i];
		s[n - 1 - i] = t;
	}
}

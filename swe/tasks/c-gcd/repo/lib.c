#include "lib.h"

/* gcd is the greatest common divisor of a and b. */
unsigned gcd(unsigned a, unsigned b) {
	if (a == 0 || b == 0)
		return 0;
	while (b != 0) {
		unsigned t = a % b;
		a = b;
		b = t;
	}
	return a;
}

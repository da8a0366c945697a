unsigned gcd(unsigned a, unsigned b);

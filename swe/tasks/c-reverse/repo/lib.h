void reverse(char *s);

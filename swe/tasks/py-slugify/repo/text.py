import re


def slugify(s):
    """Lower-case s and join its words with single dashes."""
    s = s.strip().lower()
    return re.sub(r"[^a-z0-9]", "-", s)

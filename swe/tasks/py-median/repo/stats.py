def median(xs):
    """The median of a non-empty list of numbers."""
    s = sorted(xs)
    return s[len(s) // 2]

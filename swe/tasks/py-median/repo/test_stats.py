import unittest

from stats import median


class T(unittest.TestCase):
    def test_single(self):
        self.assertEqual(median([4]), 4)

    def test_odd(self):
        self.assertEqual(median([3, 1, 2]), 2)

    def test_even(self):
        self.assertEqual(median([4, 1, 3, 2]), 2.5)

import unittest

from roman import to_roman


class T(unittest.TestCase):
    def test_one(self):
        self.assertEqual(to_roman(1), "I")

    def test_thirty(self):
        self.assertEqual(to_roman(30), "XXX")

    def test_four(self):
        self.assertEqual(to_roman(4), "IV")

    def test_forty_nine(self):
        self.assertEqual(to_roman(49), "XLIX")

import unittest

from mathx import clamp


class T(unittest.TestCase):
    def test_below(self):
        self.assertEqual(clamp(-5, 0, 10), 0)

    def test_inside(self):
        self.assertEqual(clamp(7, 0, 10), 7)

    def test_above(self):
        self.assertEqual(clamp(15, 0, 10), 10)


if __name__ == "__main__":
    unittest.main()

import unittest

from text import slugify


class T(unittest.TestCase):
    def test_lower(self):
        self.assertEqual(slugify("Hello"), "hello")

    def test_spaces(self):
        self.assertEqual(slugify("hello world"), "hello-world")

    def test_collapse(self):
        self.assertEqual(slugify("hello,  big world"), "hello-big-world")

# Names a function-call program may use without importing them, as on LeetCode: function.py executes
# this file into the program's namespace before the program runs (comments only, no docstring, so the
# program's namespace gets no __doc__ from here).
# The imports are the point (they are the program's namespace), and their order matters: collections'
# Counter and OrderedDict replace typing's.
# ruff: noqa: F401, F403, I001

from typing import *
import bisect
import collections
import copy
import functools
import heapq
import itertools
import math
import operator
import random
import re
import string
from bisect import bisect_left, bisect_right, insort
from collections import Counter, defaultdict, deque, OrderedDict
from functools import cache, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, nlargest, nsmallest
from itertools import accumulate, combinations, permutations, product
from math import ceil, floor, gcd, inf, isqrt, log, sqrt

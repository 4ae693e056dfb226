"""`serving.search.query_vector`: what a search query may be, and what a bad one is told."""

from __future__ import annotations

import numpy as np
import pytest

from dsl.types import Vector
from serving.search import query_vector
from serving.vector_common import VectorSearchError


def test_numpy_scalars_are_the_numbers_they_hold():
    assert query_vector([np.float64(1.5), np.float32(2), np.int64(3)], Vector(3)) == [1.5, 2.0, 3.0]
    assert query_vector(np.array([1, 2, 3], dtype=np.int32), Vector(3)) == [1.0, 2.0, 3.0]


def test_a_bad_query_is_told_what_it_holds():
    with pytest.raises(VectorSearchError, match=r"a list of 3 numbers, got a list holding str 'x'"):
        query_vector([1.0, "x", 2.0], Vector(3))
    with pytest.raises(VectorSearchError, match=r"a list of 3 numbers, got str"):
        query_vector("1,2,3", Vector(3))
    with pytest.raises(VectorSearchError, match=r"all zeros, which has no direction for COSINE"):
        query_vector([0, 0.0, 0], Vector(3, "COSINE"))
    assert query_vector([0, 0, 0], Vector(3)) == [0.0, 0.0, 0.0]   # L2: the origin is a fine query

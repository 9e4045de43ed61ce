"""Fixtures for the integration tests."""

import pytest
from helpers.runs import write_tiny_corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A tiny parallel corpus with its vocabulary, written once per test module."""
    return write_tiny_corpus(tmp_path_factory.mktemp("corpus"))

"""The browser tests that need a real cluster use the end-to-end one (tests/e2e/)."""

from tests.e2e.conftest import cluster  # noqa: F401 - fixture

"""The CLI's live tests use the end-to-end cluster: a live server, the loop and a real agent."""

from tests.e2e.conftest import cluster, token  # noqa: F401 - fixtures

"""Telling users what happened to their jobs: the notifier that delivers the outbox
(scheduler/outbox.py) by email and webhooks."""

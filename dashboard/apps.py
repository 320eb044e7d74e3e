from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"

    def ready(self) -> None:
        """Connect the live renderer to the scheduler's change notices (scheduler.notify):
        the scheduler never imports the web side."""
        from dashboard import live
        from scheduler import notify

        notify.connect(live.publish)
        notify.connect_log(live.publish_log)

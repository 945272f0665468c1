from django.apps import AppConfig


class DashboardConfig(AppConfig):
    name = "dashboard"
    verbose_name = "Dashboard"

    def ready(self) -> None:
        # A key or a person gone: what the box keeps for them goes too.
        from dashboard import forgetting
        from dashboard.chat import images

        forgetting.connect()
        images.connect()  # a chat image's file goes with the last record naming it

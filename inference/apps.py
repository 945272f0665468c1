from django.apps import AppConfig
from django.db.models.signals import pre_save


class InferenceConfig(AppConfig):
    name = "inference"
    verbose_name = "Inference"

    def ready(self) -> None:
        from inference import storable

        # Every model's, the other apps' too: a row must be storable on PostgreSQL and SQLite.
        pre_save.connect(storable.on_save, dispatch_uid="inference.storable")

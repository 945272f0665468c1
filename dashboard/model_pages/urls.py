"""/models/: the model pages. Fixed paths come first; inference.catalog.importing.RESERVED_NAMES
keeps a model from being named like one of them."""

from django.urls import path, re_path

from dashboard.model_pages import actions, copy_to_box, derive, pulls, views

urlpatterns = [
    path("", views.model_list, name="models"),
    path("status/", views.status, name="models-status"),
    path("scan/", actions.scan, name="models-scan"),
    path("upload/", actions.upload, name="models-upload"),
    path("download/", actions.download, name="models-download"),
    path("pull/", pulls.pull, name="models-pull"),
    path("derive/", derive.derive, name="models-derive"),
    path("jobs/<int:pk>/", views.job_status, name="model-job"),
    path("jobs/<int:pk>/cancel/", actions.job_cancel, name="model-job-cancel"),
    path("jobs/<int:pk>/retry/", actions.job_retry, name="model-job-retry"),
    path("jobs/<int:pk>/dismiss/", actions.job_dismiss, name="model-job-dismiss"),
    # A sha256 is never a model's page: a second path part and 64 hex digits.
    re_path(r"^files/(?P<sha256>[0-9a-f]{64})/$", copy_to_box.model_file, name="model-file"),
    path("<slug:name>/", views.model_detail, name="model-detail"),
    path("<slug:name>/load/", actions.load, name="model-load"),
    path("<slug:name>/unload/", actions.unload, name="model-unload"),
    path("<slug:name>/apply/", actions.apply, name="model-apply"),
    path("<slug:name>/projector/", actions.upload_projector, name="model-projector"),
    path("<slug:name>/reload/", actions.reload, name="model-reload"),
    path("<slug:name>/forget-prompts/", actions.forget_prompts, name="model-forget-prompts"),
    path("<slug:name>/default/", actions.make_default, name="model-default"),
    path("<slug:name>/copy/", copy_to_box.copy_to_box, name="model-copy"),
    path("<slug:name>/boxes/", copy_to_box.boxes, name="model-boxes"),
    path("<slug:name>/delete/", actions.delete, name="model-delete"),
]

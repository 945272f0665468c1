# A model's fill-in-the-middle tokens (metadata["fim"]: LLMModel.fim_tokens, the capability
# "insert") are read from its GGUF header at import since this release. Models registered
# before have none recorded, so a code model imported then would not list "insert" until a
# rescan: this reads each such model's header once. A file that is gone or no longer reads
# (inference.gguf.reader's checks) is left as it was: the catalog's own checks say so at load.
# The reader is the same validating one the import uses; it parses only the header and the
# vocabulary's texts, never the weights.

from django.db import migrations


def record_fim_tokens(apps, schema_editor):
    from inference.gguf.fim_tokens import as_record
    from inference.gguf.reader import GGUFError, read_gguf

    LLMModel = apps.get_model("inference", "LLMModel")
    for model in LLMModel.objects.exclude(file_path="").only("pk", "file_path", "metadata"):
        metadata = model.metadata if isinstance(model.metadata, dict) else {}
        if "fim" in metadata:
            continue
        try:
            info = read_gguf(model.file_path)
        except (GGUFError, OSError):
            continue
        metadata["fim"] = as_record(info.fim)
        LLMModel.objects.filter(pk=model.pk).update(metadata=metadata)


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0010_projector"),
    ]

    operations = [
        migrations.RunPython(record_fim_tokens, migrations.RunPython.noop),
    ]

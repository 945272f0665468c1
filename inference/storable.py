"""Values that every database the appliance runs on can store, so that a row is the same in both
modes. PostgreSQL (split mode, as docker-compose.yml deploys it) refuses what SQLite (embedded
mode) takes: a NUL character in text or JSON, an integer beyond its column's type, a NaN or an
infinity in JSON. What a model writes, an app or a person sends and a GGUF file says may hold
any of them, so every save passes here (`on_save`, a pre_save receiver connected in
InferenceConfig.ready) and so do the few bulk updates of free text (`values`):

- NUL (U+0000) in a text field, or in a JSON field's strings and keys, becomes U+FFFD, the
  replacement character, as a decoder marks what it cannot show;
- a NaN or an infinity in JSON becomes null, as in the JSON the browsers get;
- an integer beyond its column (Django's portable ranges: an IntegerField is 32-bit) becomes
  None where the field may be null (a GGUF that claims a context of 2^40 tokens: unknown), else
  the nearest bound.
"""

import logging
import math
from typing import Any

from django.db import models
from django.db.backends.base.operations import BaseDatabaseOperations

log = logging.getLogger(__name__)

NUL = "\x00"
REPLACEMENT = "\ufffd"
INTEGER_RANGES = BaseDatabaseOperations.integer_field_ranges  # internal type -> (low, high)


def text(value: str) -> str:
    return value.replace(NUL, REPLACEMENT) if NUL in value else value


def json_value(value: Any) -> Any:
    if isinstance(value, str):
        return text(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {text(k) if isinstance(k, str) else k: json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item) for item in value]
    return value


def field_value(field: models.Field, value: Any) -> Any:
    """`value` as `field`'s column can hold it."""
    if value is None:
        return None
    if isinstance(field, models.JSONField):
        return json_value(value)
    if isinstance(value, str) and isinstance(field, models.CharField | models.TextField):
        return text(value)
    bounds = INTEGER_RANGES.get(field.get_internal_type())
    if bounds is not None and isinstance(value, int) and not bounds[0] <= value <= bounds[1]:
        kept = None if field.null else min(max(value, bounds[0]), bounds[1])
        log.warning("%s = %d is beyond its column; stored as %s", field, value, kept)
        return kept
    return value


def values(model: type[models.Model], /, **fields: Any) -> dict[str, Any]:
    """Keyword arguments for `QuerySet.update()` on `model`, made storable."""
    return {name: field_value(model._meta.get_field(name), value) for name, value in fields.items()}


def on_save(
    sender: type[models.Model], instance: models.Model, update_fields=None, **kwargs
) -> None:
    skipped = instance.get_deferred_fields()  # not loaded: reading one would query for it
    for field in sender._meta.concrete_fields:
        if field.attname in skipped or (update_fields and field.name not in update_fields):
            continue
        value = getattr(instance, field.attname)
        storable = field_value(field, value)
        if storable is not value:
            setattr(instance, field.attname, storable)

"""Which registered model a name means: Ollama's "name:tag" and the names a model was pulled
as, or the default model. ("Registry", in this project, is only ever a remote model registry that
/api/pull fetches from: inference.catalog.pulling.)"""

from inference.catalog.pulling.names import canonical
from inference.models import SERVING_RELATED, LLMModel, PulledName


class UnknownModel(LookupError):
    pass


def default_model() -> LLMModel | None:
    models = LLMModel.objects.for_serving()
    return models.filter(is_default=True).first() or models.first()


def resolve(name: str | None) -> LLMModel:
    """A model by its name in the catalog (Ollama's "name:tag" accepted), or the default one."""
    if not name:
        model = default_model()
        if model is None:
            raise UnknownModel("no model is registered yet")
        return model
    base = name.split(":", 1)[0] if name.endswith(":latest") else name
    # The base, draft and projector come along: spec_for reads them on the event loop.
    model = LLMModel.objects.for_serving().filter(name__in={name, base}).first()
    if model is None and (pulled := canonical(name)):
        # The name it was pulled as: "llama3.2" is "llama3.2:latest", as in Ollama.
        found = (
            PulledName.objects.select_related(*(f"model__{field}" for field in SERVING_RELATED))
            .filter(name__iexact=pulled, model__hidden=False)
            .first()
        )
        model = found.model if found else None
    if model is None:
        raise UnknownModel(f"model {name!r} not found")
    return model


def forget_name(model: LLMModel, name: str) -> bool:
    """Ollama's delete of one of a model's several names: that pulled name goes, the model and
    its other names stay. False (nothing done) unless `name` is one of several."""
    pulled = canonical(name)
    names = model.pulled_names.all()
    if pulled is None or names.count() < 2:
        return False
    return names.filter(name__iexact=pulled).delete()[0] > 0

"""Schemathesis over /api/openapi.json against the live appliance: requests generated from the
description (its bodies are the pydantic schemas the endpoints validate with) never get a 500,
and every answer matches what the description says (status codes, content types, shapes)."""

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

schemathesis.experimental.OPEN_API_3_1.enable()

SHORT = 4  # tokens per generated answer: the point is the edges, not long answers


@pytest.fixture
def api_schema(appliance):
    return schemathesis.from_uri(f"{appliance.url}/api/openapi.json", base_url=appliance.url)


schema = schemathesis.from_pytest_fixture("api_schema")


def keep_answers_short(body) -> None:
    """Generated bodies may ask for up to a million tokens; cap them (bounds are tested in
    test_validation)."""
    if not isinstance(body, dict):
        return
    if "input" in body:  # /v1/responses (the embedding endpoints ignore the field)
        tokens = body.get("max_output_tokens")
        if not isinstance(tokens, int) or tokens > SHORT:
            body["max_output_tokens"] = SHORT
    if "messages" in body or "prompt" in body:
        for field in ("max_tokens", "max_completion_tokens"):
            if not isinstance(body.get(field), int) or body[field] > SHORT:
                body[field] = SHORT
        options = body.get("options")
        if not isinstance(options, dict):
            options = body["options"] = {}
        options["num_predict"] = SHORT
        if "n_predict" in body or "messages" not in body:  # llama-server's /completion
            body["n_predict"] = SHORT


@pytest.mark.model
@pytest.mark.timeout(600)  # about two minutes on an idle 2-core box
@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_never_answers_500_and_matches_its_description(case, appliance):
    keep_answers_short(case.body)
    response = case.call(headers=appliance.headers("chat-app"), timeout=120)
    case.validate_response(
        response,
        checks=(
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ),
    )

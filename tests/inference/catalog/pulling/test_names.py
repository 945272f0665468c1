"""Model names resolve as Ollama's do: defaults filled, the shortest form shown with its tag,
compared without regard to case; a registry on the LAN may have a port."""

import pytest

from inference.catalog.pulling.names import InvalidName, canonical, parse


@pytest.mark.parametrize(
    ("name", "host", "namespace", "model", "tag"),
    [
        ("llama3.2", "", "library", "llama3.2", "latest"),
        ("llama3.2:1b", "", "library", "llama3.2", "1b"),
        ("jmorgan/tiny:q4_0", "", "jmorgan", "tiny", "q4_0"),
        ("registry.ollama.ai/library/qwen3:0.6b", "registry.ollama.ai", "library", "qwen3", "0.6b"),
        ("nas.local:5000/home/tiny:v1", "nas.local:5000", "home", "tiny", "v1"),
        ("https://nas.local/home/tiny", "nas.local", "home", "tiny", "latest"),
        ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M", "hf.co", "bartowski",
         "Llama-3.2-1B-Instruct-GGUF", "Q4_K_M"),
    ],
)  # fmt: skip
def test_a_name_is_split_into_its_parts_with_ollamas_defaults(name, host, namespace, model, tag):
    parsed = parse(name)
    assert (parsed.host, parsed.namespace, parsed.model, parsed.tag) == (
        host, namespace, model, tag,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("llama3.2", "llama3.2:latest"),
        ("llama3.2:1b", "llama3.2:1b"),
        ("library/llama3.2:1b", "llama3.2:1b"),
        ("registry.ollama.ai/library/llama3.2:1b", "llama3.2:1b"),
        ("registry.ollama.ai/jmorgan/tiny", "jmorgan/tiny:latest"),
        ("127.0.0.1:8080/ns/tiny:v1", "127.0.0.1:8080/ns/tiny:v1"),
        ("huggingface.co/unsloth/Qwen3-GGUF", "huggingface.co/unsloth/Qwen3-GGUF:latest"),
    ],
)
def test_a_name_is_shown_in_its_shortest_form_with_the_tag(name, shown):
    assert parse(name).display == shown
    assert canonical(name) == shown


def test_hugging_face_hosts_are_recognised_whatever_their_case():
    assert parse("HF.co/user/repo:Q8_0").is_hugging_face
    assert parse("huggingface.co/user/repo").is_hugging_face
    assert not parse("user/repo").is_hugging_face


def test_the_registry_name_of_a_pull_is_a_slug():
    assert parse("llama3.2:1b").slug == "llama3-2-1b"
    assert parse("llama3.2").slug == "llama3-2"
    assert parse("hf.co/u/SmolLM2-135M-GGUF:Q4_K_M").slug == "smollm2-135m-gguf-q4_k_m"


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("", "required"),
        ("a/b/c/d", "too many parts"),
        ("llama3.2:", "tag"),
        ("-x", "model"),
        ("ns.x/model", "namespace"),
        ("model@sha256-abc", "digest"),
        ("bad host/ns/model", "host"),
        ("x" * 201, "at most 200"),
        ("ns/../model", "'..'"),
        ("model:tag with space", "tag"),
    ],
)
def test_what_is_not_a_name_is_refused_with_the_part_named(name, says):
    with pytest.raises(InvalidName, match=says):
        parse(name)
    assert canonical(name) is None

"""Fill in the middle on a live appliance with a code model (tests.code_model) beside the
starter model: llama-server's /infill over plain HTTP, Ollama's `suffix` through the ollama
client, OpenAI's through the openai client, all laid out as llama-server lays out /infill;
the refusal for a model without FIM tokens; the limits an editor sets; a cancelled completion
freeing its sequence; a warm-up filling the prompt cache for the next keystroke; code that
spells control tokens read as plain characters, as llama-server reads it."""

import httpx
import llama_cpp
import ollama
import openai
import pytest

from inference.text.infill import (
    FILE_LINE,
    REPO_LINE,
    ExtraChunk,
    FimVocab,
    InfillText,
    layout,
    pieces,
)
from tests.code_model import FIM_IDS, REPO_ID
from tests.dashboard.api.ollama.test_client import wait_until
from tests.dashboard.api.server import STARTER, Appliance, prepare

pytestmark = pytest.mark.model

CODER = "smollm2-coder"
VOCAB = FimVocab(pre=FIM_IDS["fim_pre"], suf=FIM_IDS["fim_suf"], mid=FIM_IDS["fim_mid"],
                 rep=REPO_ID, sep=FIM_IDS["fim_sep"])  # fmt: skip
PREFIX = "def fibonacci(n):\n    if n < 2:\n        return n\n"
SUFFIX = "\n\nprint(fibonacci(10))\n"
GREEDY = {"temperature": 0, "n_predict": 12}
# The model's answers end after a token or two; a grammar that never lets it end writes lines
# for as long as it is let.
LINES = 'root ::= "  a\\n" root'
# Control tokens' text as a file may hold it: SmolLM2's end of text, and the code model's FIM
# prefix token (tests.code_model: <issue_start> serves as fim_pre).
SPELLED = "<|endoftext|><issue_start>"


@pytest.fixture(scope="module")
def coder(tmp_path_factory, code_model_path) -> Appliance:
    """An appliance of its own (the shared one lists the starter model alone), with the code
    model registered from its file as an import would."""
    running = prepare(tmp_path_factory.mktemp("fim-appliance"))
    running.shell(
        "from inference.catalog.importing import register_file\n"
        "from inference.models import LLMModel\n"
        f"model = register_file({str(code_model_path)!r}, source='import', name={CODER!r})\n"
        "LLMModel.objects.filter(pk=model.pk).update(n_ctx=2048, parallel=4, n_threads=2,\n"
        "                                            n_batch=512, keep_alive='-1')\n"
    )
    running.start()
    yield running
    running.stop()


@pytest.fixture
def http(coder) -> httpx.Client:
    with httpx.Client(base_url=coder.url, headers=coder.headers("chat-app"), timeout=120) as c:
        yield c


def infill(http: httpx.Client, **body) -> dict:
    response = http.post("/infill", json={"model": CODER, **body})
    assert response.status_code == 200, response.text
    return response.json()


def tokens(http: httpx.Client, text: str, *, parse_special: bool = True) -> list[int]:
    response = http.post("/tokenize", json={"model": CODER, "content": text,
                                            "parse_special": parse_special})  # fmt: skip
    assert response.status_code == 200, response.text
    return response.json()["tokens"]


def expected_layout(http: httpx.Client, text: InfillText) -> list[int]:
    """llama-server's layout of `text` for the code model, each piece tokenized alone."""
    ids = {piece: tokens(http, piece.text, parse_special=piece.parse_special)
           for piece in pieces(text, VOCAB)}  # fmt: skip
    return layout(text, VOCAB, ids, n_batch=512, n_ctx=2048)


@pytest.fixture(scope="module")
def llama_cpp_tokenize(code_model_path):
    """llama.cpp's own tokenizer of the code model, as llama-server calls it (no BOS)."""
    model = llama_cpp.Llama(str(code_model_path), vocab_only=True, verbose=False)

    def tokenize(text: str, *, parse_special: bool) -> list[int]:
        return model.tokenize(text.encode(), add_bos=False, special=parse_special)

    yield tokenize
    model.close()


def test_infill_reads_llama_servers_layout_and_answers_deterministically(http):
    text = InfillText(PREFIX, SUFFIX, prompt="    ")
    first = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, prompt="    ", **GREEDY)
    again = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, prompt="    ", **GREEDY)
    assert first["tokens_evaluated"] == len(expected_layout(http, text))
    assert first["content"] and first["content"] == again["content"]
    assert first["stop"] is True and first["stop_type"] in ("eos", "limit")
    assert first["model"] == CODER


def test_n_predict_ends_the_answer_with_stop_type_limit(http):
    answer = infill(http, input_prefix="", input_suffix="", grammar=LINES, **GREEDY)
    assert answer["tokens_predicted"] == 12 and answer["stop_type"] == "limit"
    assert answer["content"].startswith("  a\n  a\n")


def test_input_extra_goes_before_the_prefix_with_its_file_lines(http):
    extra = [{"filename": "util.py", "text": "def helper():\n    return 1\n"}]
    text = InfillText(PREFIX, SUFFIX, extra=(ExtraChunk(extra[0]["text"], "util.py"),))
    with_extra = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, input_extra=extra,
                        **GREEDY)  # fmt: skip
    without = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, **GREEDY)
    laid_out = expected_layout(http, text)
    assert with_extra["tokens_evaluated"] == len(laid_out)
    assert laid_out[0] == REPO_ID and laid_out.count(VOCAB.sep) == 2
    assert with_extra["tokens_evaluated"] > without["tokens_evaluated"]
    assert len(tokens(http, REPO_LINE + FILE_LINE)) > 0


def test_ollama_and_openai_suffix_answer_as_infill_without_extra(coder, http):
    plain = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, **GREEDY)
    client = ollama.Client(host=coder.url, headers=coder.headers("chat-app"), timeout=120)
    generated = client.generate(CODER, PREFIX, suffix=SUFFIX, raw=True,
                                options={"temperature": 0, "num_predict": 12})  # fmt: skip
    assert generated.response == plain["content"]
    # Ollama counts the prompt tokens computed: the same prompt is in the cache by now.
    assert generated.prompt_eval_count < plain["tokens_evaluated"]
    completions = openai.OpenAI(base_url=f"{coder.url}/v1", api_key=coder.keys["chat-app"])
    completed = completions.completions.create(model=CODER, prompt=PREFIX, suffix=SUFFIX,
                                               temperature=0, max_tokens=12)  # fmt: skip
    assert completed.choices[0].text == plain["content"]
    assert completed.usage.prompt_tokens == plain["tokens_evaluated"]


def test_show_lists_insert_with_a_suffix_template_for_the_code_model_only(coder):
    client = ollama.Client(host=coder.url, headers=coder.headers("chat-app"), timeout=120)
    shown = client.show(CODER)
    assert "insert" in shown.capabilities
    assert ".Suffix" in shown.template and "<issue_start>" in shown.template
    starter = client.show(STARTER)
    assert "insert" not in starter.capabilities
    assert ".Suffix" not in starter.template


def test_a_model_without_fim_tokens_is_refused_in_ollamas_words(coder, http):
    client = ollama.Client(host=coder.url, headers=coder.headers("chat-app"), timeout=120)
    with pytest.raises(ollama.ResponseError) as refused:
        client.generate(STARTER, "def f(", suffix=")\n", raw=True)
    assert refused.value.status_code == 400
    assert refused.value.error == f'"{STARTER}" does not support insert'
    response = http.post("/infill", json={"model": STARTER, "input_prefix": "a",
                                          "input_suffix": "b"})  # fmt: skip
    assert response.status_code == 400
    assert "Infill is not supported by this model" in response.json()["error"]["message"]


def test_a_warm_up_answers_nothing_and_the_next_request_reuses_its_prefix(http):
    prefix = PREFIX * 8 + "# warm\n"
    warm = infill(http, input_prefix=prefix, input_suffix=SUFFIX, n_predict=0)
    assert warm["content"] == "" and warm["tokens_predicted"] == 0
    assert warm["tokens_evaluated"] > 100
    typed = infill(http, input_prefix=prefix, input_suffix=SUFFIX, prompt="x", **GREEDY)
    # The same file up to the cursor: only the tokens after the shared prefix are computed.
    assert typed["timings"]["cache_n"] >= len(tokens(http, prefix)) - 1
    assert typed["timings"]["prompt_n"] < typed["tokens_evaluated"] // 2


def test_t_max_predict_ms_ends_the_answer_at_the_first_new_line_past_it(http):
    body = {"input_prefix": "", "input_suffix": "", "grammar": LINES, "temperature": 0,
            "n_predict": 40}  # fmt: skip
    unlimited = infill(http, **body)
    assert unlimited["content"].count("\n") >= 5
    # 1 ms after the first token, the next token with a new line ends it: the first line.
    limited = infill(http, **body, t_max_predict_ms=1)
    assert limited["stop_type"] == "limit"
    assert limited["content"] == "  a\n"


def test_n_indent_cuts_the_first_line_indented_less(http):
    grammar = 'root ::= "  a\\n" "  b\\n" "c\\n" root'
    answer = infill(http, input_prefix="", input_suffix="", grammar=grammar, temperature=0,
                    n_predict=40, n_indent=2)  # fmt: skip
    assert answer["stop_type"] == "limit"
    assert answer["content"] == "  a\n  b\n"


def test_t_max_prompt_ms_gives_up_on_a_prompt_too_slow_to_read(http):
    long_prefix = "x = 1\n" * 300
    answer = infill(http, input_prefix=long_prefix, input_suffix="", grammar=LINES,
                    n_predict=40, t_max_prompt_ms=1)  # fmt: skip
    assert answer["content"] == "" and answer["stop_type"] == "limit"


def test_response_fields_keep_only_what_an_editor_reads(http):
    fields = ["content", "timings/prompt_n", "timings/predicted_n", "truncated"]
    answer = infill(http, input_prefix=PREFIX, input_suffix=SUFFIX, response_fields=fields,
                    samplers=["top_k", "top_p", "infill"], cache_prompt=True, grammar=LINES,
                    **GREEDY)  # fmt: skip
    assert set(answer) == set(fields)
    assert answer["timings/predicted_n"] == 12


def test_logit_bias_raises_a_token_to_the_first_of_the_answer(http):
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "temperature": 0, "n_predict": 1,
            "ignore_eos": True}  # fmt: skip
    token = tokens(http, "zebra")[0]
    piece = http.post("/detokenize", json={"model": CODER, "tokens": [token]}).json()["content"]
    plain = infill(http, **body)["content"]
    for bias in ([[token, 100]], {str(token): 100}):
        assert infill(http, **body, logit_bias=bias)["content"] == piece != plain


def test_a_bad_field_is_refused_and_names_itself(http):
    response = http.post("/infill", json={"model": CODER, "input_prefix": "a",
                                          "input_suffix": "b", "n_predict": -5})  # fmt: skip
    assert response.status_code == 400
    assert "n_predict" in response.text
    response = http.post("/infill", json={"model": CODER, "input_prefix": "a"})
    assert response.status_code == 400 and "input_suffix" in response.text


def test_a_completion_whose_editor_leaves_frees_its_sequence(coder):
    assert wait_until(lambda: coder.running_sequences() == 0)
    body = {"model": CODER, "input_prefix": PREFIX, "input_suffix": SUFFIX, "stream": True,
            "n_predict": 2000, "grammar": LINES}  # fmt: skip
    with httpx.Client(base_url=coder.url, timeout=120) as client:
        with client.stream("POST", "/infill", json=body,
                           headers=coder.headers("chat-app")) as response:  # fmt: skip
            assert response.status_code == 200
            lines = response.iter_lines()
            received = [line for line, _ in zip(lines, range(6), strict=False) if line]
            assert received and received[0].startswith("data: ")
            assert coder.running_sequences() == 1
    assert wait_until(lambda: coder.running_sequences() == 0)


def test_code_that_spells_control_tokens_is_tokenized_as_plain_characters(http,
                                                                          llama_cpp_tokenize):
    code = PREFIX + SPELLED
    plain = tokens(http, code, parse_special=False)
    assert plain == llama_cpp_tokenize(code, parse_special=False)
    assert 0 not in plain and VOCAB.pre not in plain
    parsed = tokens(http, code)  # every other caller: special tokens' text is the token
    assert parsed == llama_cpp_tokenize(code, parse_special=True)
    assert parsed[-2:] == [0, VOCAB.pre]


def test_infill_reads_spelled_control_tokens_as_llama_server_does(http, llama_cpp_tokenize):
    # The code (prefix, suffix, an extra chunk and its file name) spells control tokens; only
    # `prompt` is parsed for them, as llama-server parses it.
    extra = [{"filename": "fim<|endoftext|>.py", "text": SPELLED + "\n"}]
    text = InfillText(PREFIX + SPELLED, SPELLED + SUFFIX, prompt="  <|endoftext|>",
                      extra=(ExtraChunk(extra[0]["text"], extra[0]["filename"]),))  # fmt: skip
    answer = infill(http, input_prefix=text.prefix, input_suffix=text.suffix, prompt=text.prompt,
                    input_extra=extra, **GREEDY)  # fmt: skip
    ids = {piece: llama_cpp_tokenize(piece.text, parse_special=piece.parse_special)
           for piece in pieces(text, VOCAB)}  # fmt: skip
    laid_out = layout(text, VOCAB, ids, n_batch=512, n_ctx=2048)
    assert answer["tokens_evaluated"] == len(laid_out)
    # The control tokens appear once each where llama-server puts them, never from the code.
    assert laid_out.count(VOCAB.pre) == 1 and laid_out.count(0) == 1
    parsed = {piece: llama_cpp_tokenize(piece.text, parse_special=True) for piece in ids}
    assert len(layout(text, VOCAB, parsed, n_batch=512, n_ctx=2048)) != len(laid_out)

"""The benchmark's prompts: plain prose built from a salt, so every process builds the same ones.

No llama_cpp here: each side tokenizes with its own tokenizer (the engine's runner, or raw
llama.cpp), which is the same `llama_tokenize` call on the same GGUF, so equal (count, salt) give
equal token ids in every process.
"""

from collections.abc import Callable

TEXT = (
    "The household server sits in a cupboard next to the router. It keeps the family's photos, "
    "runs the backups every night at {n} o'clock, and answers questions from the kitchen tablet. "
    "When a long document arrives, the server reads all of it before answering, and paragraph "
    "{n} of the manual explains why reading is fast while writing the answer is slow. "
)
FOLLOW_UP = "\nAnd what does paragraph 3 say about backups?\n"
# Every prompt ends in a count, which greedy decoding carries on for hundreds of tokens: prose
# cut mid-sentence often ends in an end-of-generation token within 20 tokens, and then an
# engine stream stops where the raw baseline (which never stops) decodes on.
TAIL = " Count: 1, 2, 3,"


def prompt_text(count: int, salt: int) -> str:
    """About `count` tokens of prose (a little more: make_tokens cuts it to size); `salt`
    changes the first words, so no two prompts share a prefix (the prefix cache must not help
    where it is not being measured)."""
    paragraphs = (TEXT.format(n=salt * 1000 + i) for i in range(count // 40 + 1))
    return f"Note {salt}: " + "".join(paragraphs)


def make_tokens(tokenize: Callable[..., list[int]], count: int, salt: int) -> list[int]:
    """Exactly `count` prompt tokens: the salted prose (with the model's BOS, as the engine
    adds it to text) cut to size, then TAIL. `tokenize(text, add_special)`."""
    tail = tokenize(TAIL, False)
    if count < len(tail) + 6:  # room for BOS and the salted words that keep prompts apart
        raise ValueError(f"a prompt needs at least {len(tail) + 6} tokens")
    head = tokenize(prompt_text(count, salt))
    while len(head) < count:
        head += head[1:]
    return head[: count - len(tail)] + tail


HOME_AREAS = ("Kitchen", "Living Room", "Bedroom", "Office", "Bathroom", "Hallway", "Garage",
              "Garden", "Guest Room")  # fmt: skip
HOME_KINDS = (("light", "Ceiling Light", "off"), ("light", "Lamp", "on"), ("switch", "Plug", "off"),
              ("sensor", "Temperature", "21.4 °C"), ("sensor", "Humidity", "48 %"),
              ("binary_sensor", "Motion", "off"), ("cover", "Blinds", "open"),
              ("climate", "Thermostat", "heat"), ("media_player", "Speaker", "idle"),
              ("fan", "Fan", "off"))  # fmt: skip
HOME_TOOLS = ("HassTurnOn", "HassTurnOff", "HassSetPosition", "HassLightSet",
              "HassClimateSetTemperature", "HassMediaPause", "HassMediaUnpause",
              "HassGetState")  # fmt: skip
HOME_COMMANDS = ("Turn on the kitchen lamp.", "Is the garage fan on?", "Close the bedroom blinds.",
                 "What is the temperature in the office?", "Turn off every light in the hallway.",
                 "Pause the speaker in the living room.", "Set the guest room to 19 degrees.",
                 "Is there motion in the garden?")  # fmt: skip


def home_prompt(entities: int = 26) -> str:
    """A Home-Assistant-like system prompt (its voice assistant's instructions, the exposed
    entities as YAML, the intent tools named): about 1,000 tokens for the starter model."""
    lines = [
        "You are a voice assistant for Home Assistant.",
        "Answer questions about the world truthfully. Answer in plain text, simply.",
        "When controlling Home Assistant always call the intent tools: "
        + ", ".join(HOME_TOOLS) + ".",
        "An overview of the areas and the devices in this smart home:",
    ]
    for n in range(entities):
        domain, name, state = HOME_KINDS[n % len(HOME_KINDS)]
        area = HOME_AREAS[n // len(HOME_KINDS) % len(HOME_AREAS)]
        slug = f"{area} {name}".lower().replace(" ", "_")
        lines.append(f"- names: {area} {name}\n  domain: {domain}\n  state: '{state}'\n"
                     f"  areas: {area}\n  entity_id: {domain}.{slug}")  # fmt: skip
    return "\n".join(lines)

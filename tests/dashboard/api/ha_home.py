"""What Home Assistant's Ollama integration sends for a voice command, for a home of 90 exposed
entities: its system prompt (instructions, then every entity as YAML) and its intent tools with
their parameter schemas (homeassistant/components/ollama/entity.py formats each tool as
{"type": "function", "function": {"name", "description", "parameters"}}, the parameters an
OpenAPI object schema of the intent's slots)."""

AREAS = ["Kitchen", "Living Room", "Bedroom", "Office", "Bathroom", "Hallway", "Garage",
         "Garden", "Guest Room"]  # fmt: skip
# (domain, what the entity is called, its state, attributes): ten of each kind, one per area.
KINDS = [
    ("light", "Ceiling Light", "off", {}),
    ("light", "Lamp", "on", {"brightness": 180}),
    ("switch", "Plug", "off", {}),
    ("sensor", "Temperature", "21.4", {"unit_of_measurement": "°C"}),
    ("sensor", "Humidity", "48", {"unit_of_measurement": "%"}),
    ("binary_sensor", "Motion", "off", {}),
    ("cover", "Blinds", "open", {}),
    ("climate", "Thermostat", "heat", {"temperature": 20}),
    ("media_player", "Speaker", "idle", {}),
    ("fan", "Fan", "off", {}),
]
assert len(AREAS) * len(KINDS) == 90

INSTRUCTIONS = """You are a voice assistant for Home Assistant.
Answer questions about the world truthfully.
Answer in plain text. Keep it simple and to the point.
When controlling Home Assistant always call the intent tools. When controlling a device, pass
its name and domain. When controlling an area, pass the area name and domain.
When asked to turn on all devices of one type, ask for an area, unless there is only one.
This device is not able to start timers.
Current time is 19:04:11. Today's date is 2026-12-01.
Static Context: An overview of the areas and the devices in this smart home:
"""


def entities() -> str:
    lines = []
    for area in AREAS:
        for domain, kind, state, attributes in KINDS:
            lines += [f"- names: {area} {kind}", f"  domain: {domain}", f"  state: '{state}'",
                      f"  areas: {area}"]  # fmt: skip
            if attributes:
                lines.append("  attributes:")
                lines += [f"    {key}: {value}" for key, value in attributes.items()]
    return "\n".join(lines) + "\n"


def system_prompt() -> str:
    return INSTRUCTIONS + entities()


def _slots(**properties) -> dict:
    return {"type": "object", "properties": properties, "required": []}


_TARGET = {
    "name": {"type": "string"},
    "area": {"type": "string"},
    "floor": {"type": "string"},
    "domain": {"type": "array", "items": {"type": "string", "enum": sorted({k[0] for k in KINDS})}},
    "device_class": {"type": "array", "items": {"type": "string",
                                                "enum": ["blind", "outlet", "switch", "tv"]}},
}  # fmt: skip


def _tool(name: str, description: str, parameters: dict) -> dict:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


HA_TOOLS = [
    _tool("HassTurnOn", "Turns on/opens/presses a device or entity", _slots(**_TARGET)),
    _tool("HassTurnOff", "Turns off/closes a device or entity", _slots(**_TARGET)),
    _tool("HassSetPosition", "Sets the position of a device or entity", _slots(
        **_TARGET, position={"type": "integer", "minimum": 0, "maximum": 100})),
    _tool("HassLightSet", "Sets the brightness percentage or color of a light", _slots(
        name={"type": "string"}, area={"type": "string"}, color={"type": "string"},
        brightness={"type": "integer", "minimum": 0, "maximum": 100})),
    _tool("HassClimateSetTemperature", "Sets the target temperature of a climate device",
          _slots(name={"type": "string"}, area={"type": "string"},
                 temperature={"type": "number"})),
    _tool("HassMediaPause", "Pauses a media player", _slots(name={"type": "string"},
                                                           area={"type": "string"})),
    _tool("HassMediaUnpause", "Resumes a media player", _slots(name={"type": "string"},
                                                              area={"type": "string"})),
    _tool("HassSetVolume", "Sets the volume percentage of a media player", _slots(
        name={"type": "string"}, area={"type": "string"},
        volume_level={"type": "integer", "minimum": 0, "maximum": 100})),
    _tool("GetLiveContext", "Provides real-time information about the CURRENT state, value, "
          "or mode of devices, sensors, entities, or areas", _slots()),
]  # fmt: skip

COMMANDS = ["Turn on the kitchen ceiling light", "Is the garage motion sensor on?",
            "Set the bedroom thermostat to 19 degrees"]  # fmt: skip
